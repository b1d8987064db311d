// Byte-level BPE tokenizer that reproduces llama.cpp's LLAMA_VOCAB_TYPE_BPE path:
//   special-token partition -> UTF-8 sanitising -> regex pre-tokenizer (PCRE2) ->
//   GPT-2 byte->unicode mapping -> rank-ordered BPE merges per word.
// Also Tokenizer::Create (the SentencePiece tokenizer is in tokenizer_spm.cc) and the
// StreamDecoder. See tests/golden/tokenizer/README.md for the golden data and known divergences.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "model/tokenizer_internal.h"

namespace tandem::model {
namespace {

using internal::kAttrByte;
using internal::kAttrControl;
using internal::kAttrNormal;
using internal::kAttrUnknown;
using internal::kAttrUserDefined;

constexpr const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// ------------------------------------------------------------------------------------ UTF-8
// Length of the well-formed UTF-8 sequence starting at s[0] (n > 0 bytes available), or 0 if
// the bytes there are not a well-formed sequence. *prefix gets the number of bytes that form a
// valid beginning of a sequence (>= 1 when s[0] is a lead byte); if that prefix runs into the end
// of the buffer, *truncated is set (more bytes could still complete it).
size_t Utf8SeqLen(const unsigned char* s, size_t n, size_t* prefix, bool* truncated) {
  *truncated = false;
  *prefix = 0;
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return *prefix = 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  *prefix = 1;
  for (size_t i = 1; i < len; ++i) {
    if (i >= n) {
      *truncated = true;
      return 0;
    }
    const unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
    if (s[i] < lo_i || s[i] > hi_i) return 0;
    *prefix = i + 1;
  }
  return len;
}

// Appends `in` to *out with ill-formed bytes replaced by U+FFFD. per_byte: one U+FFFD per bad
// byte (llama.cpp's input policy); otherwise one per maximal ill-formed subpart. If hold_tail,
// a truncated sequence at the very end is not consumed. Returns the number of bytes consumed.
size_t AppendSanitized(std::string_view in, bool per_byte, bool hold_tail, std::string* out) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    size_t run = i;  // copy runs of ASCII / valid sequences in one append
    size_t prefix = 0;
    bool truncated = false;
    while (run < n) {
      if (s[run] < 0x80) {
        ++run;
        continue;
      }
      size_t len = Utf8SeqLen(s + run, n - run, &prefix, &truncated);
      if (len == 0) break;
      run += len;
    }
    out->append(in.data() + i, run - i);
    i = run;
    if (i == n) break;
    if (truncated && hold_tail) break;
    out->append(kReplacement);
    i += per_byte ? 1 : std::max<size_t>(prefix, 1);
  }
  return i;
}

bool IsValidUtf8(std::string_view in) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  for (size_t i = 0, prefix; i < in.size();) {
    bool truncated;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = Utf8SeqLen(s + i, in.size() - i, &prefix, &truncated);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// Only for codepoints < 0x800, all that the byte-level mapping uses.
void AppendCodepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. Every mapped codepoint is < 0x800 (two UTF-8 bytes at most).
struct ByteLevel {
  std::array<std::string, 256> encoded;  // byte -> UTF-8 of its codepoint
  std::array<int16_t, 0x200> decoded;    // codepoint -> byte, -1 if none
  ByteLevel() {
    decoded.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : next++;
      AppendCodepoint(cp, &encoded[b]);
      decoded[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevel& GetByteLevel() {
  static const ByteLevel table;
  return table;
}

// Byte-level text of a token -> raw bytes. Codepoints outside the mapping are kept as UTF-8.
std::string ByteLevelDecode(std::string_view text) {
  const ByteLevel& bl = GetByteLevel();
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    size_t prefix;
    bool truncated;
    size_t len = Utf8SeqLen(s + i, text.size() - i, &prefix, &truncated);
    if (len == 0) len = 1;
    uint32_t cp = s[i];
    if (len == 2) cp = ((s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
    if (len <= 2 && cp < bl.decoded.size() && bl.decoded[cp] >= 0) {
      out.push_back(static_cast<char>(bl.decoded[cp]));
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

// ------------------------------------------------------------------------------------ regex
// Whitespace as llama.cpp defines it (Unicode White_Space), spelled out because PCRE2 10.42's
// \s with UCP also matches U+180E. Used in place of \s in every pattern below.
#define WS                                                                              \
  "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
  "\\x{205F}\\x{3000}"
// The GPT-2 pattern; llama.cpp's list omits the final |\s+ but keeps unmatched text as pieces,
// which is equivalent.
constexpr const char kGpt2Pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                      "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";
constexpr const char kLlama3Pattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS
    "]+";
#undef WS

struct PreTokenizerSpec {
  std::vector<std::string_view> names;  // tokenizer.ggml.pre values
  std::vector<const char*> patterns;    // applied in order, as llama.cpp's regex_exprs
  bool ignore_merges;                   // whole word that is a token -> that token
};
const std::vector<PreTokenizerSpec>& PreTokenizerSpecs() {
  static const std::vector<PreTokenizerSpec> specs = {
      // llama.cpp's names ("gpt2" is tandem's alias for "gpt-2").
      {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo"}, {kGpt2Pattern}, false},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"},
       {"\\p{N}", kGpt2Pattern},
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Pattern}, true},
  };
  return specs;
}

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable; matching is thread-safe
// given per-call match data.
class Regex {
 public:
  static StatusOr<std::shared_ptr<Regex>> Compile(const char* pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Internal("pre-tokenizer regex failed to compile at offset " + std::to_string(err_off) +
                      ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: interpreter is used
    return std::shared_ptr<Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }

  // Splits every [off, off+len) piece of `text` (valid UTF-8) llama.cpp-style: matches become
  // pieces and so does the unmatched text between them. The pattern sees only the piece.
  void Split(std::string_view text, const std::vector<std::pair<size_t, size_t>>& in,
             pcre2_match_data* md, std::vector<std::pair<size_t, size_t>>* out) const {
    for (auto [off, len] : in) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + off);
      size_t pos = 0, emitted = 0;
      while (pos < len) {
        int rc = pcre2_match(code_, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < -1) {  // JIT stack or match limit: retry with the heap-based interpreter
          rc =
              pcre2_match(code_, subject, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
        }
        if (rc < 0) break;  // no match (or a hard error): the rest stays one piece
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > emitted) out->emplace_back(off + emitted, ms - emitted);
        if (me > ms) out->emplace_back(off + ms, me - ms);
        emitted = std::max(emitted, me);
        if (me == ms) {  // empty match: step one character
          ++me;
          while (me < len && (subject[me] & 0xC0) == 0x80) ++me;
        }
        pos = me;
      }
      if (emitted < len) out->emplace_back(off + emitted, len - emitted);
    }
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// ------------------------------------------------------------------------------------ BPE
struct Merge {
  int32_t rank;
  int32_t result;  // token id of the concatenation
};
inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Per-call scratch state; keeps Encode allocation-light and the tokenizer itself immutable.
struct Scratch {
  struct Symbol {
    int32_t id;  // current token id; kDead once merged into its left neighbour
    int32_t prev, next;
  };
  struct Bigram {
    int32_t rank, left, right, left_id, right_id, result;
    // Heap order: lowest rank first, then leftmost (as llama.cpp's llm_bigram_bpe comparator).
    bool operator<(const Bigram& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  static constexpr int32_t kDead = -2;
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
  std::vector<std::pair<size_t, size_t>> pieces, pieces_tmp;
  std::vector<internal::Fragment> fragments;
  std::string sanitized;
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { pcre2_match_data_free(md); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Build(const VocabData& v);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  std::string TokenToPiece(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? pieces_[id] : std::string();
  }
  bool IsControl(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (attrs_.attrs[id] & (kAttrControl | kAttrUnknown));
  }
  bool IsEndOfGeneration(int32_t id) const override {
    return id >= 0 && id < vocab_size() && attrs_.eog[id];
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  bool add_bos() const override { return add_bos_; }

 private:
  void EncodeText(std::string_view text, Scratch& s, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, Scratch& s, std::vector<int32_t>* out) const;
  void TryPush(Scratch& s, int32_t left, int32_t right) const;

  std::vector<std::string> texts_;                       // id -> token text (byte-level)
  std::vector<std::string> pieces_;                      // id -> raw bytes (TokenToPiece)
  internal::VocabAttributes attrs_;                      // llama.cpp attributes, EOG set
  std::unordered_map<std::string, int32_t> text_to_id_;  // byte-level text -> id
  std::array<int32_t, 256> byte_token_;  // raw byte -> id of its one-character token, or -1
  std::unordered_map<uint64_t, Merge> merges_;
  std::unique_ptr<internal::SpecialTokenSplitter> splitter_;  // over texts_
  std::vector<std::shared_ptr<Regex>> regexes_;
  bool ignore_merges_ = false;
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = false;
};

StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Build(const VocabData& v) {
  const PreTokenizerSpec* spec = nullptr;
  std::string known;
  for (const auto& s : PreTokenizerSpecs()) {
    for (auto name : s.names) {
      if (name == v.pre) spec = &s;
      known += (known.empty() ? "" : ", ") + std::string(name);
    }
  }
  if (spec == nullptr) {
    return InvalidArgument("unsupported tokenizer.ggml.pre '" + v.pre +
                           "' for a gpt2 tokenizer (supported: " + known + ")");
  }
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  TANDEM_ASSIGN_OR_RETURN(internal::VocabAttributes attrs, internal::AnalyzeVocab(v, v.eos_id));

  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  tok->attrs_ = std::move(attrs);
  tok->bos_id_ = v.bos_id;
  tok->eos_id_ = v.eos_id;
  tok->add_bos_ = v.add_bos;
  tok->ignore_merges_ = spec->ignore_merges;
  for (const char* p : spec->patterns) {
    TANDEM_ASSIGN_OR_RETURN(auto re, Regex::Compile(p));
    tok->regexes_.push_back(std::move(re));
  }

  tok->texts_ = v.tokens;
  tok->pieces_.resize(n);
  tok->text_to_id_.reserve(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = v.tokens[id];
    const uint8_t attr = tok->attrs_.attrs[id];
    tok->text_to_id_[text] = id;  // duplicates: the last id wins, as in llama.cpp
    // llama.cpp's token_to_piece (special=true), tests in its order.
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      tok->pieces_[id] = text;  // stored verbatim, not byte-level encoded
    } else if (attr & kAttrNormal) {
      tok->pieces_[id] = ByteLevelDecode(text);
    } else if ((attr & kAttrByte) && text.size() >= 5) {
      // "<0xXX>" byte-fallback tokens (none in a byte-level vocabulary, but llama.cpp reads them)
      tok->pieces_[id] =
          std::string(1, static_cast<char>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16)));
    }  // unused / undefined tokens render as nothing
  }
  tok->splitter_ = std::make_unique<internal::SpecialTokenSplitter>(tok->texts_, tok->attrs_.attrs);

  const ByteLevel& bl = GetByteLevel();
  for (int b = 0; b < 256; ++b) {
    auto it = tok->text_to_id_.find(bl.encoded[b]);
    tok->byte_token_[b] = it == tok->text_to_id_.end() ? -1 : it->second;
  }

  tok->merges_.reserve(v.merges.size());
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& m = v.merges[rank];
    const size_t sp = m.find(' ', 1);  // as llama.cpp: the first part is never empty
    auto bad = [&](const std::string& why) {
      return InvalidArgument("merge #" + std::to_string(rank) + " '" + m + "': " + why);
    };
    if (sp == std::string::npos) return bad("expected two space-separated parts");
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    auto ia = tok->text_to_id_.find(a), ib = tok->text_to_id_.find(b),
         ic = tok->text_to_id_.find(a + b);
    if (ia == tok->text_to_id_.end()) return bad("unknown token '" + a + "'");
    if (ib == tok->text_to_id_.end()) return bad("unknown token '" + b + "'");
    if (ic == tok->text_to_id_.end()) return bad("result '" + a + b + "' is not a token");
    // Duplicate pairs keep their first (lowest) rank, as llama.cpp's bpe_ranks.emplace.
    tok->merges_.emplace(PairKey(ia->second, ib->second),
                         Merge{static_cast<int32_t>(rank), ic->second});
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  Scratch scratch;
  splitter_->Split(text, parse_special, &scratch.fragments);
  for (const internal::Fragment& f : scratch.fragments) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else if (f.len > 0) {
      EncodeText(text.substr(f.off, f.len), scratch, &out);
    }
  }
  return out;
}

void BpeTokenizer::EncodeText(std::string_view text, Scratch& s, std::vector<int32_t>* out) const {
  // Ill-formed UTF-8 becomes one U+FFFD per bad byte, as llama.cpp's unicode_cpts_from_utf8.
  if (!IsValidUtf8(text)) {
    s.sanitized.clear();
    AppendSanitized(text, /*per_byte=*/true, /*hold_tail=*/false, &s.sanitized);
    text = s.sanitized;
  }
  s.pieces.assign(1, {0, text.size()});
  for (const auto& re : regexes_) {
    s.pieces_tmp.clear();
    re->Split(text, s.pieces, s.md, &s.pieces_tmp);
    s.pieces.swap(s.pieces_tmp);
  }
  for (auto [off, len] : s.pieces) EncodeWord(text.substr(off, len), s, out);
}

void BpeTokenizer::TryPush(Scratch& s, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const int32_t a = s.symbols[left].id, b = s.symbols[right].id;
  if (a < 0 || b < 0) return;
  auto it = merges_.find(PairKey(a, b));
  if (it == merges_.end()) return;
  s.heap.push_back({it->second.rank, left, right, a, b, it->second.result});
  std::push_heap(s.heap.begin(), s.heap.end());
}

// BPE over one pre-tokenized word. Invariant: every live symbol is a run of the word's bytes
// whose byte-level text is token symbols[i].id (or -1 for a byte with no token), and the live
// symbols, linked by prev/next, tile the word in order.
void BpeTokenizer::EncodeWord(std::string_view word, Scratch& s, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string encoded;
    for (unsigned char c : word) encoded += GetByteLevel().encoded[c];
    auto it = text_to_id_.find(encoded);
    if (it != text_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const int32_t n = static_cast<int32_t>(word.size());
  s.symbols.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = byte_token_[static_cast<unsigned char>(word[i])];
    s.symbols[i] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  s.heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) TryPush(s, i, i + 1);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const Scratch::Bigram bg = s.heap.back();
    s.heap.pop_back();
    Scratch::Symbol& l = s.symbols[bg.left];
    Scratch::Symbol& r = s.symbols[bg.right];
    // Stale entry: a side has merged since (ids only change by merging, and a token id fixes
    // its text, so equal ids mean both symbols are unchanged and still adjacent).
    if (l.id != bg.left_id || r.id != bg.right_id || l.next != bg.right) continue;
    l.id = bg.result;
    l.next = r.next;
    if (r.next >= 0) s.symbols[r.next].prev = bg.left;
    r.id = Scratch::kDead;
    TryPush(s, l.prev, bg.left);
    TryPush(s, bg.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) {
    // A byte without a token (SmolLM2 lacks e.g. 0x04 and 0xF1) is dropped, as llama.cpp does;
    // <unk> would be no better: SmolLM2's unk is <|endoftext|>.
    if (s.symbols[i].id >= 0) out->push_back(s.symbols[i].id);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(const VocabData& vocab) {
  if (vocab.tokens.empty()) return InvalidArgument("tokenizer vocabulary is empty");
  if (vocab.model == "gpt2") return BpeTokenizer::Build(vocab);
  if (vocab.model == "llama") return internal::CreateSpmTokenizer(vocab);
  if (vocab.model == "bert" || vocab.model == "t5" || vocab.model == "rwkv" ||
      vocab.model == "plamo2") {
    return Unimplemented("tokenizer.ggml.model '" + vocab.model +
                         "' is not supported; tandem implements byte-level BPE ('gpt2') and "
                         "SentencePiece ('llama')");
  }
  return InvalidArgument("unknown tokenizer.ggml.model '" + vocab.model + "'");
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += TokenToPiece(id);
  return out;
}

std::vector<int32_t> Tokenizer::EndOfGenerationIds() const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsEndOfGeneration(id)) ids.push_back(id);
  }
  return ids;
}

std::string StreamDecoder::Push(int32_t id) {
  pending_ += tokenizer_->TokenToPiece(id);
  std::string out;
  const size_t used = AppendSanitized(pending_, /*per_byte=*/false, /*hold_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  AppendSanitized(pending_, /*per_byte=*/false, /*hold_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace tandem::model
