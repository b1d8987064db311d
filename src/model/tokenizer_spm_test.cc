// SentencePiece ("llama") tokenizer rules on toy vocabularies, independent of the golden data
// (gemma_tokenizer_test.cc checks the real vocabulary against llama.cpp).
#include <gtest/gtest.h>

#include "model/tokenizer.h"

namespace tandem::model {
namespace {

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kByte = 6;

// Ids: 0 <unk>, 1 <s>, 2 </s>, 3 <ctl>, 4 "a", 5 "b", 6 "c", 7 "ab", 8 "bc", 9 "▁a", 10 "aa",
// 11 <0x7A> ('z'), 12 <0xC3>, 13 <0xA9> (the bytes of "é"), 14 "<end_of_turn>", 15 "<ud>".
VocabData ToyVocab(float score_ab, float score_bc) {
  VocabData v;
  v.model = "llama";
  v.pre = "default";
  v.tokens = {
      "<unk>",  "<s>",    "</s>",   "<ctl>",         "a",   "b", "c", "ab", "bc", "▁a", "aa",
      "<0x7A>", "<0xC3>", "<0xA9>", "<end_of_turn>", "<ud>"};
  v.token_types = {kControl, kControl, kControl, kControl, kNormal, kNormal, kNormal, kNormal,
                   kNormal,  kNormal,  kNormal,  kByte,    kByte,   kByte,   kNormal, kUserDefined};
  v.scores = {0, 0, 0, 0, -10, -10, -10, score_ab, score_bc, -1, -3, 0, 0, 0, 0, 0};
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  v.add_space_prefix = false;
  return v;
}

std::unique_ptr<Tokenizer> Make(const VocabData& v) {
  auto tok = Tokenizer::Create(v);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

using Ids = std::vector<int32_t>;

TEST(SpmTokenizerTest, MergesHighestScoreFirst) {
  EXPECT_EQ(Make(ToyVocab(-1, -2))->Encode("abc", false, false), (Ids{7, 6}));
  EXPECT_EQ(Make(ToyVocab(-2, -1))->Encode("abc", false, false), (Ids{4, 8}));
}

TEST(SpmTokenizerTest, EqualScoresMergeLeftmostFirst) {
  // "aaa": both pairs are "aa" with one score; the left pair wins.
  EXPECT_EQ(Make(ToyVocab(-1, -2))->Encode("aaa", false, false), (Ids{10, 4}));
}

TEST(SpmTokenizerTest, ByteFallbackAndUnknown) {
  auto tok = Make(ToyVocab(-1, -2));
  EXPECT_EQ(tok->Encode("z", false, false), (Ids{11}));
  EXPECT_EQ(tok->Encode("\xC3\xA9", false, false), (Ids{12, 13}));  // é: no token, two bytes
  EXPECT_EQ(tok->Decode(Ids{12, 13}), "\xC3\xA9");
  // 'y' has neither a token nor a byte token: <unk> (llama.cpp would throw).
  EXPECT_EQ(tok->Encode("y", false, false), (Ids{0}));
}

TEST(SpmTokenizerTest, SpacesAreEscapedAndPrefixed) {
  VocabData v = ToyVocab(-1, -2);
  auto plain = Make(v);
  EXPECT_EQ(plain->Encode(" a", false, false), (Ids{9}));
  EXPECT_EQ(plain->Encode("a", true, false), (Ids{1, 4}));
  v.add_space_prefix = true;
  auto prefixed = Make(v);
  EXPECT_EQ(prefixed->Encode("a", false, false), (Ids{9}));
  EXPECT_EQ(prefixed->Encode("a", true, false), (Ids{1, 9}));
  // The prefix goes before the first fragment and after every special token (llama.cpp).
  EXPECT_EQ(prefixed->Encode("a<ctl>a<ud>a", false, true), (Ids{9, 3, 9, 15, 9}));
  EXPECT_EQ(plain->Encode("a<ctl>a<ud>a", false, true), (Ids{4, 3, 4, 15, 4}));
  EXPECT_EQ(prefixed->TokenToPiece(9), " a");
}

TEST(SpmTokenizerTest, SpecialTokens) {
  auto tok = Make(ToyVocab(-1, -2));
  // Control tokens only with parse_special; user-defined always.
  EXPECT_EQ(tok->Encode("<ctl>", false, true), (Ids{3}));
  EXPECT_NE(tok->Encode("<ctl>", false, false), (Ids{3}));
  EXPECT_EQ(tok->Encode("<ud>", false, false), (Ids{15}));
  EXPECT_TRUE(tok->IsControl(3));
  EXPECT_FALSE(tok->IsControl(15));
  EXPECT_EQ(tok->TokenToPiece(3), "<ctl>");
  // "<end_of_turn>" ends generation and becomes control by its text, as in llama.cpp.
  EXPECT_TRUE(tok->IsEndOfGeneration(14));
  EXPECT_TRUE(tok->IsControl(14));
  EXPECT_TRUE(tok->IsEndOfGeneration(2));  // eos
  EXPECT_FALSE(tok->IsEndOfGeneration(1));
}

TEST(SpmTokenizerTest, DefaultSpecialIds) {
  VocabData v = ToyVocab(-1, -2);
  v.bos_id = v.eos_id = v.unk_id = -1;  // the file names none: llama.cpp's 1, 2, 0
  auto tok = Make(v);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->Encode("y", false, false), (Ids{0}));
}

TEST(SpmTokenizerTest, RefusesMismatchedScores) {
  VocabData v = ToyVocab(-1, -2);
  v.scores.pop_back();
  EXPECT_EQ(Tokenizer::Create(v).status().code(), StatusCode::kInvalidArgument);
  v = ToyVocab(-1, -2);
  v.bos_id = 99;
  EXPECT_EQ(Tokenizer::Create(v).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::model
