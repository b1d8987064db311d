// SentencePiece tokenizer that reproduces llama.cpp's LLAMA_VOCAB_TYPE_SPM path
// (llm_tokenizer_spm_session in llama-vocab.cpp, llama-cpp-python 0.3.36):
//   special-token partition -> per raw fragment: optional leading space, ' ' -> U+2581 ->
//   one symbol per UTF-8 character -> merge adjacent pairs whose concatenation is a token,
//   highest score first -> each final symbol is its token or, if it is none, byte tokens.
// See tests/golden/tokenizer/README.md for the golden data (Gemma 3) and known divergences.
#include <algorithm>
#include <array>
#include <functional>

#include "model/tokenizer_internal.h"

namespace tandem::model::internal {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

// Open-addressing map from token text to id over texts owned by the tokenizer. Building it for
// 262k tokens takes a few ms (a std::unordered_map with a node per entry takes several times
// longer); lookups take a string_view, so Encode allocates nothing per probe.
class TextIndex {
 public:
  void Build(const std::vector<std::string>& texts) {
    texts_ = &texts;
    size_t cap = 16;
    while (cap < texts.size() * 2) cap <<= 1;  // load factor <= 0.5
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
    for (int32_t id = 0; id < static_cast<int32_t>(texts.size()); ++id) {
      const size_t h = Hash(texts[id]);
      const uint32_t tag = static_cast<uint32_t>(h >> 32);
      size_t i = h & mask_;
      while (slots_[i].id >= 0 && !(slots_[i].tag == tag && texts[slots_[i].id] == texts[id])) {
        i = (i + 1) & mask_;
      }
      slots_[i] = {tag, id};  // a duplicate text maps to its last id, as llama.cpp's token_to_id
    }
  }
  int32_t Find(std::string_view text) const {
    const size_t h = Hash(text);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0 || (s.tag == tag && (*texts_)[s.id] == text)) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high hash bits: most mismatches are rejected without touching the text
    int32_t id;    // token id or -1
  };
  static size_t Hash(std::string_view s) { return std::hash<std::string_view>()(s); }
  const std::vector<std::string>* texts_ = nullptr;  // not owned; the tokenizer's texts_
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Per-call scratch state; keeps the tokenizer immutable.
struct Session {
  struct Symbol {
    uint32_t off, n;  // bytes [off, off + n) of `text`; n == 0 once merged into its left
    int32_t prev, next;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;  // bytes of the concatenation; a mismatch later marks a stale entry
    // Heap order as llama.cpp's llm_bigram_spm::comparator: highest score on top, then the
    // leftmost pair.
    bool operator<(const Bigram& o) const {
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::string text;  // the escaped fragment
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
  std::vector<Fragment> fragments;
};

class SpmTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Build(const VocabData& v);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  std::string TokenToPiece(int32_t id) const override;
  bool IsControl(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (attrs_.attrs[id] & (kAttrControl | kAttrUnknown));
  }
  bool IsEndOfGeneration(int32_t id) const override {
    return id >= 0 && id < vocab_size() && attrs_.eog[id];
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(texts_.size()); }
  bool add_bos() const override { return add_bos_; }

 private:
  SpmTokenizer() = default;
  void EncodeFragment(Session& s, std::vector<int32_t>* out) const;
  void TryAddBigram(Session& s, int32_t left, int32_t right) const;

  std::vector<std::string> texts_;  // id -> token text (SentencePiece form, ▁ for spaces)
  std::vector<float> scores_;       // id -> score (0 when the file has none)
  VocabAttributes attrs_;
  TextIndex index_;
  std::array<int32_t, 256> byte_token_;  // byte -> <0xXX> token (or the one-byte token), -1
  std::unique_ptr<SpecialTokenSplitter> splitter_;
  size_t max_token_bytes_ = 0;  // no pair longer than this can be a token
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = false;
  bool add_space_prefix_ = true;
};

StatusOr<std::unique_ptr<Tokenizer>> SpmTokenizer::Build(const VocabData& v) {
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    return InvalidArgument("tokenizer has " + std::to_string(n) + " tokens but " +
                           std::to_string(v.scores.size()) + " scores");
  }
  // llama.cpp's defaults for a "llama" vocabulary whose file names no such token.
  auto or_default = [n](int32_t id, int32_t def) { return id >= 0 ? id : (def < n ? def : -1); };
  const int32_t eos = or_default(v.eos_id, 2);
  TANDEM_ASSIGN_OR_RETURN(VocabAttributes attrs, AnalyzeVocab(v, eos));

  auto tok = std::unique_ptr<SpmTokenizer>(new SpmTokenizer());
  tok->attrs_ = std::move(attrs);
  tok->bos_id_ = or_default(v.bos_id, 1);
  tok->eos_id_ = eos;
  tok->unk_id_ = or_default(v.unk_id, 0);
  tok->add_bos_ = v.add_bos;
  tok->add_space_prefix_ = v.add_space_prefix;
  tok->texts_ = v.tokens;
  for (int32_t id = 0; id < n; ++id) {
    std::string& t = tok->texts_[id];
    if (t.empty()) t = "[EMPTY_" + std::to_string(id) + "]";  // as llama.cpp names them
    tok->max_token_bytes_ = std::max(tok->max_token_bytes_, t.size());
  }
  tok->scores_ = v.scores.empty() ? std::vector<float>(n, 0.0f) : v.scores;
  tok->index_.Build(tok->texts_);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = tok->index_.Find(std::string_view(name, sizeof(name)));
    if (id < 0) id = tok->index_.Find(std::string(1, static_cast<char>(b)));
    tok->byte_token_[b] = id;
  }
  tok->splitter_ = std::make_unique<SpecialTokenSplitter>(tok->texts_, tok->attrs_.attrs);
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  Session s;
  splitter_->Split(text, parse_special, &s.fragments);
  // llama.cpp prefixes a space to the first raw fragment and to every raw fragment that
  // follows a special token (when add_space_prefix), BOS or not.
  bool prev_special = true;
  for (const Fragment& f : s.fragments) {
    if (f.id >= 0) {
      out.push_back(f.id);
      prev_special = true;
      continue;
    }
    s.text.clear();
    if (add_space_prefix_ && prev_special) s.text = kSpace;
    for (char c : text.substr(f.off, f.len)) {
      if (c == ' ') {
        s.text += kSpace;
      } else {
        s.text.push_back(c);
      }
    }
    EncodeFragment(s, &out);
    prev_special = false;
  }
  return out;
}

void SpmTokenizer::TryAddBigram(Session& s, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const Session::Symbol& l = s.symbols[left];
  const uint32_t size = l.n + s.symbols[right].n;
  if (size > max_token_bytes_) return;
  const int32_t id = index_.Find(std::string_view(s.text).substr(l.off, size));
  if (id < 0) return;
  s.heap.push_back({scores_[id], left, right, size});
  std::push_heap(s.heap.begin(), s.heap.end());
}

// Invariant: the live symbols (n > 0), linked by prev/next, tile s.text in order; each was
// either one UTF-8 character (by its lead byte, as llama.cpp's unicode_len_utf8, so ill-formed
// input groups bytes the same way) or the merge of two whose concatenation is a token. A
// symbol's start never moves and its size only grows, so an entry whose size no longer equals
// the two sizes' sum is stale (llama.cpp's test).
void SpmTokenizer::EncodeFragment(Session& s, std::vector<int32_t>* out) const {
  static constexpr uint8_t kUtf8Len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const std::string& text = s.text;
  s.symbols.clear();
  s.heap.clear();
  for (size_t off = 0; off < text.size();) {
    const size_t n =
        std::min<size_t>(kUtf8Len[static_cast<unsigned char>(text[off]) >> 4], text.size() - off);
    const int32_t index = static_cast<int32_t>(s.symbols.size());
    s.symbols.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(n), index - 1,
                         off + n == text.size() ? -1 : index + 1});
    off += n;
  }
  if (s.symbols.empty()) return;
  for (int32_t i = 1; i < static_cast<int32_t>(s.symbols.size()); ++i) TryAddBigram(s, i - 1, i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const Session::Bigram bg = s.heap.back();
    s.heap.pop_back();
    Session::Symbol& l = s.symbols[bg.left];
    Session::Symbol& r = s.symbols[bg.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) s.symbols[r.next].prev = bg.left;
    TryAddBigram(s, l.prev, bg.left);
    TryAddBigram(s, bg.left, l.next);
  }
  // Every merged symbol is a token (merges happen only then), so llama.cpp's resegment step
  // reduces to: the symbol's token, or byte fallback for a single character that is none.
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) {
    const Session::Symbol& sym = s.symbols[i];
    const std::string_view piece = std::string_view(text).substr(sym.off, sym.n);
    const int32_t id = index_.Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (unsigned char c : piece) {
      // A byte with neither a <0xXX> nor a one-byte token: llama.cpp throws (std::out_of_range
      // from byte_to_token); tandem gives <unk>, or drops the byte if there is none.
      const int32_t b = byte_token_[c] >= 0 ? byte_token_[c] : unk_id_;
      if (b >= 0) out->push_back(b);
    }
  }
}

std::string SpmTokenizer::TokenToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::string();
  const uint8_t attr = attrs_.attrs[id];
  const std::string& t = texts_[id];
  // llama.cpp's token_to_piece (special=true): the order of these tests is its order.
  if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t;
  if (attr & kAttrNormal) {
    std::string piece;
    piece.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, kSpace.size(), kSpace) == 0) {
        piece.push_back(' ');
        i += kSpace.size();
      } else {
        piece.push_back(t[i++]);
      }
    }
    return piece;
  }
  if (attr & kAttrByte) {
    // "<0xXX>": the two characters after "<0x" read as hex (llama.cpp: strtol of substr(3, 2)).
    int value = 0;
    for (size_t i = 3; i < 5 && i < t.size(); ++i) {
      const char c = t[i];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) break;
      value = value * 16 + d;
    }
    return std::string(1, static_cast<char>(value));
  }
  return std::string();  // unused or undefined tokens render as nothing
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> CreateSpmTokenizer(const VocabData& vocab) {
  return SpmTokenizer::Build(vocab);
}

}  // namespace tandem::model::internal
