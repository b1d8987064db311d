// Pieces shared by tandem's two tokenizers, both reproductions of llama.cpp's llama-vocab.cpp
// (llama-cpp-python 0.3.36): tokenizer.cc (byte-level BPE, "gpt2") and tokenizer_spm.cc
// (SentencePiece, "llama"); the attribute and partition code is in tokenizer_special.cc.
// Private to src/model.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer.h"

namespace tandem::model::internal {

// tokenizer.ggml.token_type values.
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4,
                  kTypeUnused = 5, kTypeByte = 6;

// llama.cpp's llama_token_attr bits (only those that tokenization and detokenization read).
enum TokenAttr : uint8_t {
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

// What llama.cpp's llama_vocab::impl::load derives from the token list besides the texts.
struct VocabAttributes {
  // id -> TokenAttr bits: from token_types, then llama.cpp's by-text fix-ups (end-of-generation
  // and fill-in-the-middle texts gain kAttrControl, the gpt-oss hack, '<|end|>' and '</s>'
  // exceptions).
  std::vector<uint8_t> attrs;
  std::vector<uint8_t> eog;  // id -> 1 if llama.cpp's is_eog
};

// Checks the token-type count and the special ids against the vocabulary size
// (InvalidArgument), then computes the attributes. eos_id: the EOS llama.cpp uses (the
// vocabulary's, or the tokenizer's default when the file names none); -1 for none.
StatusOr<VocabAttributes> AnalyzeVocab(const VocabData& vocab, int32_t eos_id);

// A stretch of the input after the special-token partition: a token (id >= 0) or raw text
// [off, off + len) of the input (id < 0).
struct Fragment {
  int32_t id;
  size_t off, len;
};

// llama.cpp's tokenizer_st_partition: control, user-defined and unknown tokens (by the
// attributes above) are cut out of the text, longest text first, each splitting every raw
// fragment at its leftmost non-overlapping occurrences. Without parse_special only user-defined
// tokens are cut. Immutable after construction; Split is thread-safe.
class SpecialTokenSplitter {
 public:
  // texts: id -> token text (not owned, must outlive the splitter).
  SpecialTokenSplitter(const std::vector<std::string>& texts, const std::vector<uint8_t>& attrs);

  // Replaces *out with the fragments of `text`, in order (empty for empty text).
  void Split(std::string_view text, bool parse_special, std::vector<Fragment>* out) const;

 private:
  struct Special {
    std::string_view text;
    int32_t id;
    bool always;  // matched even without parse_special (user-defined)
  };
  // Marks in *present (indexed like specials_) the specials that occur anywhere in `text`; a
  // special absent from the whole text cannot split any fragment of it, so the partition may
  // skip it. A trie walk, O(text size x longest special).
  void FindPresent(std::string_view text, bool parse_special, std::vector<uint8_t>* present) const;

  std::vector<Special> specials_;  // llama.cpp's cache_special_tokens order
  // Trie over the special texts: node 0 is the root; edges_ holds (node, byte) -> child sorted
  // for binary search; terminal_[node] is the index into specials_ or -1.
  struct Edge {
    uint32_t key;  // node << 8 | byte
    int32_t child;
  };
  std::vector<Edge> edges_;
  std::array<int32_t, 256> root_;  // the root's children (its edges_ entries), or -1
  std::vector<int32_t> terminal_;
};

// The SentencePiece ("llama") tokenizer of tokenizer_spm.cc.
StatusOr<std::unique_ptr<Tokenizer>> CreateSpmTokenizer(const VocabData& vocab);

}  // namespace tandem::model::internal
