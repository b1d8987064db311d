// Tokenizer tests. The SmolLM2 vocabulary and the llama.cpp reference token ids come from
// tests/golden/tokenizer/ (see its README.md), so no model file or Python is needed.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "model/tokenizer_test_util.h"

namespace tandem::model {
namespace {

using nlohmann::json;
using testing_util::Base64Decode;
using testing_util::HexDecode;

const json& Golden() {
  static const json j = testing_util::ReadGoldenJson("llama_cpp_tokens.json");
  return j;
}

std::unique_ptr<Tokenizer> MakeTokenizer(const std::string& pre = "smollm") {
  VocabData v = testing_util::SmolLm2Vocab();
  v.pre = pre;
  auto tok = Tokenizer::Create(v);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(tok).value();
}

const Tokenizer& Smol() {
  static const std::unique_ptr<Tokenizer> tok = MakeTokenizer();
  return *tok;
}

// Token id of the one-byte piece `b` (byte-level vocabularies have all 256).
int32_t ByteToken(const Tokenizer& tok, unsigned char b) {
  static std::map<unsigned char, int32_t> cache;
  if (cache.empty()) {
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      std::string p = tok.TokenToPiece(id);
      if (p.size() == 1 && !cache.count(static_cast<unsigned char>(p[0]))) {
        cache[static_cast<unsigned char>(p[0])] = id;
      }
    }
  }
  auto it = cache.find(b);
  return it == cache.end() ? -1 : it->second;
}

// True when every byte of `text` has a one-byte token (SmolLM2 lacks 21 of the 256 bytes,
// e.g. 0x04 and the 0xF1 lead byte; such bytes are dropped by Encode, as in llama.cpp).
bool AllBytesRepresentable(const Tokenizer& tok, const std::string& text) {
  for (unsigned char b : text) {
    if (ByteToken(tok, b) < 0) return false;
  }
  return true;
}

TEST(TokenizerTest, Metadata) {
  const Tokenizer& tok = Smol();
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos());
}

// Every golden case must match llama.cpp exactly; there are no exclusions.
TEST(TokenizerTest, MatchesLlamaCpp) {
  std::map<std::string, std::unique_ptr<Tokenizer>> toks;
  int checked = 0;
  for (const json& c : Golden()["cases"]) {
    const std::string pre = c["pre"];
    if (!toks.count(pre)) toks[pre] = MakeTokenizer(pre);
    const std::string text =
        c.contains("text") ? c["text"].get<std::string>() : HexDecode(c["hex"].get<std::string>());
    const bool special = c["parse_special"];
    std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = toks[pre]->Encode(text, /*add_bos=*/false, special);
    EXPECT_EQ(got, expected) << "pre=" << pre << " parse_special=" << special << " text=\""
                             << text.substr(0, 80) << "\"";
    ++checked;
  }
  EXPECT_GE(checked, 414);
}

TEST(TokenizerTest, PiecesMatchLlamaCpp) {
  const Tokenizer& tok = Smol();
  for (const auto& [id, b64] : Golden()["pieces_b64"].items()) {
    EXPECT_EQ(tok.TokenToPiece(std::stoi(id)), Base64Decode(b64.get<std::string>())) << id;
  }
  for (const json& d : Golden()["decodes"]) {
    std::vector<int32_t> ids = d["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.Decode(ids), Base64Decode(d["b64"].get<std::string>()));
  }
}

TEST(TokenizerTest, RoundTripsValidUtf8) {
  const Tokenizer& tok = Smol();
  for (const json& c : Golden()["cases"]) {
    if (!c.contains("text")) continue;
    const std::string text = c["text"];
    if (!AllBytesRepresentable(tok, text)) continue;
    EXPECT_EQ(tok.Decode(tok.Encode(text, false, c["parse_special"])), text);
  }
}

TEST(TokenizerTest, BytesWithoutTokensAreDropped) {
  const Tokenizer& tok = Smol();
  EXPECT_EQ(ByteToken(tok, 0x04), -1);
  EXPECT_EQ(tok.Decode(tok.Encode("a\x04"
                                  "b",
                                  false, false)),
            "ab");
}

TEST(TokenizerTest, InvalidUtf8BecomesReplacementPerByte) {
  const Tokenizer& tok = Smol();
  EXPECT_EQ(tok.Decode(tok.Encode("a\xFF\xE2\x82", false, false)),
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, AddBos) {
  const Tokenizer& tok = Smol();
  std::vector<int32_t> ids = tok.Encode("Hello", /*add_bos=*/true, false);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], tok.Encode("Hello", false, false)[0]);
  EXPECT_EQ(tok.Encode("", true, false), std::vector<int32_t>{1});
}

TEST(TokenizerTest, SpecialTokens) {
  const Tokenizer& tok = Smol();
  EXPECT_EQ(tok.Encode("<|im_start|>", false, true), std::vector<int32_t>{1});
  std::vector<int32_t> plain = tok.Encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_GE(id, 17);  // no control token
  EXPECT_EQ(tok.Decode(plain), "<|im_start|>");
  // Adjacent and repeated specials; text around them is BPE-encoded independently.
  std::vector<int32_t> ids = tok.Encode("x<|im_end|><|im_end|>y", false, true);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 2);
  EXPECT_EQ(tok.TokenToPiece(1), "<|im_start|>");
  EXPECT_EQ(tok.TokenToPiece(0), "<|endoftext|>");
}

TEST(TokenizerTest, EndOfGeneration) {
  const Tokenizer& tok = Smol();
  EXPECT_TRUE(tok.IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_TRUE(tok.IsEndOfGeneration(2));   // <|im_end|> (also eos)
  EXPECT_FALSE(tok.IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_FALSE(tok.IsEndOfGeneration(3));
  EXPECT_TRUE(tok.IsEndOfGeneration(4));  // <reponame>: llama.cpp's EOG set is {0, 2, 4}
  EXPECT_FALSE(tok.IsEndOfGeneration(5));
  EXPECT_FALSE(tok.IsEndOfGeneration(tok.Encode("Hello", false, false)[0]));
  EXPECT_FALSE(tok.IsEndOfGeneration(-1));
  EXPECT_FALSE(tok.IsEndOfGeneration(tok.vocab_size()));
}

TEST(TokenizerTest, BadIdsGiveEmptyPieces) {
  const Tokenizer& tok = Smol();
  EXPECT_EQ(tok.TokenToPiece(-1), "");
  EXPECT_EQ(tok.TokenToPiece(tok.vocab_size()), "");
  EXPECT_EQ(tok.TokenToPiece(1 << 30), "");
}

TEST(TokenizerTest, LongDegenerateInputs) {
  const Tokenizer& tok = Smol();
  for (const std::string& text : {std::string(100000, ' '), std::string(100000, 'a'),
                                  std::string(100000, '7'), std::string(50000, '\n') + "x", [] {
                                    std::string s;
                                    while (s.size() < 100000)
                                      s += "\xF0\x9F\x98\x80 \t";  // emoji, space, tab
                                    return s;
                                  }()}) {
    std::vector<int32_t> ids = tok.Encode(text, false, true);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok.Decode(ids), text);
  }
}

TEST(TokenizerTest, EncodesTenThousandTokensQuickly) {
  const Tokenizer& tok = Smol();
  std::string text;
  for (const json& c : Golden()["cases"]) {
    if (c.contains("text") && c["pre"] == "smollm") text += c["text"].get<std::string>() + "\n";
  }
  std::string english;
  for (const json& c : Golden()["cases"]) {
    const std::string t = c.value("text", "");
    if (t.size() > 4000) english = t;  // the ~5k-char English paragraph
  }
  ASSERT_FALSE(english.empty());
  while (tok.Encode(text, false, true).size() < 10000) text += english;
  double best_ms = 1e9;
  size_t n = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    n = tok.Encode(text, false, true).size();
    auto t1 = std::chrono::steady_clock::now();
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  EXPECT_GE(n, 10000u);
  EXPECT_LT(best_ms, 50.0) << n << " tokens";
  std::printf("encoded %zu tokens (%zu bytes) in %.2f ms\n", n, text.size(), best_ms);
}

TEST(TokenizerTest, ConcurrentEncodeIsConsistent) {
  const Tokenizer& tok = Smol();
  const std::string text = "Hello, world! 1234 <|im_start|>user\n日本語 😀\n\n  x";
  const std::vector<int32_t> expected = tok.Encode(text, false, true);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (tok.Encode(text, false, true) != expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(StreamDecoderTest, HoldsIncompleteCharacters) {
  const Tokenizer& tok = Smol();
  const std::string text =
      "h\xC3\xA9llo \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC";  // héllo 😀 日本
  StreamDecoder dec(&tok);
  // Feed the text one byte token at a time: output appears only on character boundaries.
  std::string out;
  for (unsigned char b : text) {
    std::string piece = dec.Push(ByteToken(tok, b));
    if (b >= 0x80 && (b & 0xC0) != 0x80) {
      EXPECT_EQ(piece, "") << "a lead byte alone must be held";
    }
    out += piece;
  }
  out += dec.Flush();
  EXPECT_EQ(out, text);

  // Real BPE tokens of the text stream out to the same string, each piece valid UTF-8.
  StreamDecoder dec2(&tok);
  out.clear();
  for (int32_t id : tok.Encode(text + " 🤗 中文", false, false)) out += dec2.Push(id);
  out += dec2.Flush();
  EXPECT_EQ(out, text + " 🤗 中文");
}

TEST(StreamDecoderTest, EmojiSplitAcrossTokens) {
  const Tokenizer& tok = Smol();
  StreamDecoder dec(&tok);
  EXPECT_EQ(dec.Push(ByteToken(tok, 0xF0)), "");
  EXPECT_EQ(dec.Push(ByteToken(tok, 0x9F)), "");
  EXPECT_EQ(dec.Push(ByteToken(tok, 0xA4)), "");
  EXPECT_EQ(dec.Push(ByteToken(tok, 0x97)), "\xF0\x9F\xA4\x97");  // 🤗
  EXPECT_EQ(dec.Flush(), "");
}

TEST(StreamDecoderTest, InvalidBytesBecomeReplacement) {
  const Tokenizer& tok = Smol();
  StreamDecoder dec(&tok);
  EXPECT_EQ(dec.Push(ByteToken(tok, 0x80)), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(dec.Push(ByteToken(tok, 0xE6)), "");
  // A lead byte followed by a non-continuation: the held byte is replaced, 'a' passes.
  EXPECT_EQ(dec.Push(ByteToken(tok, 'a')),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(dec.Push(ByteToken(tok, 0xF0)), "");
  EXPECT_EQ(dec.Push(ByteToken(tok, 0x9F)), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");  // one truncated character -> one U+FFFD
  EXPECT_EQ(dec.Flush(), "");
  EXPECT_EQ(dec.Push(1), "<|im_start|>");
}

// ------------------------------------------------------------------------------ Create errors
TEST(TokenizerCreateTest, RefusesBadVocabularies) {
  VocabData v = testing_util::SmolLm2Vocab();
  {
    VocabData e = v;
    e.tokens.clear();
    e.token_types.clear();
    auto r = Tokenizer::Create(e);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  {
    VocabData e = v;
    e.model = "t5";
    auto r = Tokenizer::Create(e);
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(r.status().message().find("'t5'"), std::string::npos) << r.status().message();
  }
  {
    VocabData e = v;
    e.model = "nonsense";
    EXPECT_EQ(Tokenizer::Create(e).status().code(), StatusCode::kInvalidArgument);
  }
  {
    VocabData e = v;
    e.pre = "qwen2";
    auto r = Tokenizer::Create(e);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("'qwen2'"), std::string::npos) << r.status().message();
  }
  {
    VocabData e = v;
    e.merges.push_back("Ġ nosuchtoken");
    auto r = Tokenizer::Create(e);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("nosuchtoken"), std::string::npos);
  }
  {
    VocabData e = v;
    e.merges.push_back("nospace");
    EXPECT_EQ(Tokenizer::Create(e).status().code(), StatusCode::kInvalidArgument);
  }
  {
    VocabData e = v;
    e.token_types.pop_back();
    EXPECT_EQ(Tokenizer::Create(e).status().code(), StatusCode::kInvalidArgument);
  }
  {
    VocabData e = v;
    e.eos_id = static_cast<int32_t>(e.tokens.size());
    EXPECT_EQ(Tokenizer::Create(e).status().code(), StatusCode::kInvalidArgument);
  }
}

// A toy vocabulary pins the merge order independently of the golden data: with merges
// "a b" (rank 0) then "b c" (rank 1), "abc" must become "ab" + "c", not "a" + "bc".
TEST(TokenizerCreateTest, MergesApplyByRank) {
  VocabData v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  v.tokens = {"a", "b", "c", "ab", "bc", "abc", "<|eot_id|>", "</s>", "<ud>"};
  v.token_types = {1, 1, 1, 1, 1, 1, 3, 4, 4};
  v.merges = {"a b", "b c", "ab c"};
  v.eos_id = 7;
  auto tok = Tokenizer::Create(v);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->Encode("abc", false, false), std::vector<int32_t>{5});
  v.merges = {"b c", "a b", "ab c"};  // "bc" first: "a"+"bc" has no merge
  tok = Tokenizer::Create(v);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->Encode("abc", false, false), (std::vector<int32_t>{0, 4}));
  EXPECT_TRUE((*tok)->IsEndOfGeneration(6));  // <|eot_id|> by text
  EXPECT_TRUE((*tok)->IsEndOfGeneration(7));  // eos
  // User-defined tokens are matched even without parse_special (as llama.cpp); control not.
  EXPECT_EQ((*tok)->Encode("a<ud>", false, false), (std::vector<int32_t>{0, 8}));
  EXPECT_FALSE((*tok)->IsControl(8));
  // ... except a user-defined "</s>": llama.cpp makes it control, as an end-of-generation text
  // (its bytes have no tokens here, so they are dropped).
  EXPECT_EQ((*tok)->Encode("a</s>", false, false), (std::vector<int32_t>{0}));
  EXPECT_EQ((*tok)->Encode("a</s>", false, true), (std::vector<int32_t>{0, 7}));
  EXPECT_TRUE((*tok)->IsControl(7));
  EXPECT_EQ((*tok)->TokenToPiece(7), "</s>");
  // A byte with no token is dropped (llama.cpp does the same).
  EXPECT_EQ((*tok)->Encode("az", false, false), std::vector<int32_t>{0});
}

}  // namespace
}  // namespace tandem::model
