// The two tokenizers of the shipped models (SmolLM2: byte-level BPE; Gemma 3: SentencePiece
// with byte fallback) on arbitrary text, and the detokenizers on arbitrary token ids.
// Input: byte 0 picks the tokenizer (bit 0) and the mode (bits 1-2: encode plain, encode with
// special tokens parsed, decode ids); the rest is text, or ids as little-endian 32-bit words.
// Properties: no crash or sanitizer report; ids within the vocabulary; plain encoding of
// well-formed UTF-8 decodes back to the text (both files say add_space_prefix = false, or
// are byte-level) whenever each of its characters does alone: SmolLM2's vocabulary has no
// token for the bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1 and 0xF2, which its tokenizer
// (as llama.cpp's) drops;
// the streaming decoder, fed the ids one by one, gives well-formed UTF-8 (ill-formed bytes
// become U+FFFD), equal to Decode's bytes whenever those are well-formed.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"

namespace {

using namespace tandem;

struct Fixture {
  model::TextFrontEnd bpe = fuzz::LoadFrontEnd("SmolLM2-135M-Instruct.Q4_1.gguf");
  model::TextFrontEnd spm = fuzz::LoadFrontEnd("gemma-3-270m-q4_k_m.gguf");
};

const Fixture& GetFixture() {
  static const Fixture* f = new Fixture();
  return *f;
}

bool WellFormedUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Whether the character (well-formed UTF-8) survives encoding and decoding alone; cached.
bool CharRoundTrips(const model::Tokenizer& tok, std::string_view ch) {
  static std::map<std::pair<const model::Tokenizer*, std::string>, bool> cache;
  auto key = std::make_pair(&tok, std::string(ch));
  auto it = cache.find(key);
  if (it == cache.end()) {
    const std::vector<int32_t> ids = tok.Encode(ch, /*add_bos=*/false, /*parse_special=*/false);
    it = cache.emplace(std::move(key), tok.Decode(ids) == ch).first;
  }
  return it->second;
}

bool EveryCharRoundTrips(const model::Tokenizer& tok, std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (!CharRoundTrips(tok, text.substr(i, n))) return false;
    i += n;
  }
  return true;
}

std::string StreamDecode(const model::Tokenizer& tok, const std::vector<int32_t>& ids) {
  model::StreamDecoder d(&tok);
  std::string out;
  for (int32_t id : ids) out += d.Push(id);
  return out + d.Flush();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& fx = GetFixture();
  const bool spm = data[0] & 1;
  const int mode = (data[0] >> 1) % 3;
  const model::Tokenizer& tok = spm ? *fx.spm.tokenizer : *fx.bpe.tokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<int32_t> ids;
  if (mode == 2) {
    ids.resize(text.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), text.data(), ids.size() * 4);
  } else {
    ids = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/mode == 1);
    for (int32_t id : ids) TANDEM_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  }
  const std::string decoded = tok.Decode(ids);
  if (mode == 0 && WellFormedUtf8(text) && decoded != text && EveryCharRoundTrips(tok, text)) {
    std::fprintf(stderr, "fuzz: round trip of %zu bytes gave %zu:\n", text.size(), decoded.size());
    for (int32_t id : ids) {
      std::fprintf(stderr, "%d[", id);
      for (unsigned char c : tok.TokenToPiece(id)) std::fprintf(stderr, "%02x", c);
      std::fprintf(stderr, "] ");
    }
    std::fprintf(stderr, "\n");
    TANDEM_FUZZ_CHECK(decoded == text);
  }
  const std::string streamed = StreamDecode(tok, ids);
  TANDEM_FUZZ_CHECK(WellFormedUtf8(streamed));
  if (WellFormedUtf8(decoded)) TANDEM_FUZZ_CHECK(streamed == decoded);
  return 0;
}
