// Tokenizers built from GGUF tokenizer metadata, each reproducing llama.cpp exactly: byte-level
// BPE (GPT-2 style, tokenizer.ggml.model "gpt2") and SentencePiece ("llama", e.g. Gemma 3);
// plus a streaming detokenizer that never splits a UTF-8 character across pieces.
//
//   TANDEM_ASSIGN_OR_RETURN(auto tok, Tokenizer::Create(vocab));
//   std::vector<int32_t> ids = tok->Encode("Hello", /*add_bos=*/false, /*parse_special=*/true);
//
// Thread-safety: a Tokenizer is immutable after Create; all const methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::model {

// The tokenizer.* metadata of a GGUF file, copied out of the mapping.
struct VocabData {
  std::string model;                // tokenizer.ggml.model, e.g. "gpt2"
  std::string pre;                  // tokenizer.ggml.pre, e.g. "smollm" (may be empty)
  std::vector<std::string> tokens;  // id -> token text (byte-level encoded for gpt2)
  std::vector<int32_t>
      token_types;  // id -> 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;  // "a b" pairs in priority order
  std::vector<float> scores;        // id -> merge score (SentencePiece); empty when absent
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;  // tokenizer.ggml.add_bos_token
  bool add_eos = false;  // tokenizer.ggml.add_eos_token
  // tokenizer.ggml.add_space_prefix (SentencePiece: a space is prepended to the text); llama.cpp
  // defaults it to true for "llama" vocabularies when the key is absent.
  bool add_space_prefix = true;
};

class Tokenizer {
 public:
  // Supports model "gpt2" (byte-level BPE) with the smollm/starcoder, gpt-2 and llama3 families
  // of pre-tokenizers, and model "llama" (SentencePiece: scores, byte fallback <0xXX>,
  // add_space_prefix; pre-tokenizer ignored, as llama.cpp). Refuses: an empty vocabulary,
  // unknown pre-tokenizers, merges naming unknown tokens, mismatched array sizes, special ids
  // outside the vocabulary (InvalidArgument); other known models (Unimplemented).
  static StatusOr<std::unique_ptr<Tokenizer>> Create(const VocabData& vocab);
  virtual ~Tokenizer() = default;

  // Text -> token ids. add_bos prepends BOS (callers pass vocab.add_bos for raw completions).
  // parse_special: text equal to a control token (e.g. "<|im_start|>") becomes that token;
  // otherwise such text is tokenized as plain bytes. User-defined tokens are always matched
  // (as llama.cpp), except those llama.cpp reclassifies as control (end-of-generation texts
  // such as "</s>"). Ill-formed UTF-8: BPE encodes one U+FFFD per bad byte; SentencePiece
  // keeps the bytes (as byte tokens), both as llama.cpp does.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The raw bytes a token stands for (control tokens give their text): llama.cpp's
  // token_to_piece with special=true. Empty for bad ids.
  virtual std::string TokenToPiece(int32_t id) const = 0;
  // Concatenated pieces, as llama.cpp's server renders output token by token. llama.cpp's
  // llama_detokenize (unparse_special=true) gives the same except that, for a vocabulary with
  // add_space_prefix, it drops a leading space of the first piece (Gemma 3 has none).
  std::string Decode(std::span<const int32_t> ids) const;
  // Tokens llama.cpp renders only with special=true (control and unknown tokens, by llama.cpp's
  // attributes): their piece is empty when special tokens are hidden.
  virtual bool IsControl(int32_t id) const = 0;

  // End-of-generation tokens as llama.cpp's is_eog (EOS, <|im_end|>, <|endoftext|>,
  // <end_of_turn>, ...).
  virtual bool IsEndOfGeneration(int32_t id) const = 0;
  // Every id for which IsEndOfGeneration holds, ascending (a scan of the vocabulary).
  std::vector<int32_t> EndOfGenerationIds() const;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual bool add_bos() const = 0;
};

// Turns a token stream into text pieces, holding back bytes of an incomplete UTF-8 character
// until the rest arrives. Not thread-safe; one per sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Returns the complete UTF-8 text made available by this token (possibly empty).
  std::string Push(int32_t id);
  // Returns whatever is held back (invalid trailing bytes become U+FFFD).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace tandem::model
