#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace tandem::engine {
namespace {

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}).token, 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.05f * i;
  SamplingParams p{.temperature = 1.0f, .seed = 7};
  Sampler a(p), b(p);
  p.seed = 8;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    const int32_t x = a.Sample(logits).token;
    EXPECT_EQ(x, b.Sample(logits).token);
    differ += x != c.Sample(logits).token;
  }
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> logits = {5.0f, 4.0f, 3.0f, 0.0f, -2.0f, -5.0f};
  auto support = [&](SamplingParams p) {
    Sampler s(p);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 4000; ++i) seen[s.Sample(logits).token]++;
    return seen;
  };
  auto k2 = support({.temperature = 1.0f, .top_k = 2, .seed = 1});
  EXPECT_EQ(k2.size(), 2u);
  EXPECT_TRUE(k2.count(0) && k2.count(1));
  // p(0)=0.665, p(1)=0.245: top_p 0.8 keeps exactly ids 0 and 1.
  auto p80 = support({.temperature = 1.0f, .top_p = 0.8f, .seed = 2});
  EXPECT_EQ(p80.size(), 2u);
  // min_p 0.3: keeps tokens with p >= 0.3 * p(0): ids 0 (1.0) and 1 (0.37), not 2 (0.135).
  auto m30 = support({.temperature = 1.0f, .min_p = 0.3f, .seed = 3});
  EXPECT_EQ(m30.size(), 2u);
  // High temperature flattens: all six appear.
  auto hot = support({.temperature = 5.0f, .seed = 4});
  EXPECT_EQ(hot.size(), 6u);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  Sampler s({.temperature = 1.0f, .seed = 9});
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.Sample(logits).token == 1;
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(SamplerTest, ValidateNamesTheField) {
  EXPECT_NE(SamplingParams{.temperature = -1}.Validate().message().find("temperature"),
            std::string::npos);
  EXPECT_NE(SamplingParams{.top_k = -2}.Validate().message().find("top_k"), std::string::npos);
  EXPECT_NE(SamplingParams{.top_p = 0}.Validate().message().find("top_p"), std::string::npos);
  EXPECT_NE(SamplingParams{.min_p = 1.5f}.Validate().message().find("min_p"), std::string::npos);
  const SamplingParams good{.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f};
  EXPECT_TRUE(good.Validate().ok());
}

TEST(SamplerTest, ResumeContinuesTheSameStreamOfDraws) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 1234;
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i) * 3.0f;
  Sampler whole(p);
  std::vector<int32_t> expect;
  for (int i = 0; i < 40; ++i) expect.push_back(whole.Sample(logits).token);
  // A second sampler resumes after the first 7 draws and must continue identically.
  Sampler continued(p);
  continued.Resume(std::span(expect).first(7));
  for (int i = 7; i < 40; ++i) EXPECT_EQ(continued.Sample(logits).token, expect[i]) << "draw " << i;
}

TEST(SamplerTest, ResumeCountsTokensForThePenalties) {
  // Greedy with a frequency penalty: each draw of a token lowers it, so the argmax alternates
  // in a way that depends on the history; a resumed sampler must see the same history.
  SamplingParams p{.frequency_penalty = 1.5f};
  const std::vector<float> logits = {2.0f, 1.9f, 1.0f};
  Sampler whole(p);
  std::vector<int32_t> expect;
  for (int i = 0; i < 12; ++i) expect.push_back(whole.Sample(logits).token);
  Sampler continued(p);
  continued.Resume(std::span(expect).first(5));
  for (int i = 5; i < 12; ++i) EXPECT_EQ(continued.Sample(logits).token, expect[i]) << i;
}

TEST(SamplerTest, LogitBiasMovesTheArgmaxAndCanBanAToken) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  Sampler boosted({.logit_bias = {{2, 2.5f}}});
  EXPECT_EQ(boosted.Sample(logits).token, 2);  // 1 + 2.5 > 3
  // -100 makes a token practically impossible even when sampling hot.
  Sampler banned({.temperature = 2.0f, .seed = 5, .logit_bias = {{0, -100.0f}}});
  for (int i = 0; i < 2000; ++i) ASSERT_NE(banned.Sample(logits).token, 0);
}

TEST(SamplerTest, MinTokensMasksEndTokensUntilReached) {
  const std::vector<float> logits = {0.0f, 1.0f, 9.0f, 5.0f};  // 2 = end token, 3 = stop id
  const std::vector<int32_t> end = {2};
  Sampler s({.min_tokens = 3, .stop_token_ids = {3}}, {}, end);
  EXPECT_EQ(s.Sample(logits).token, 1);  // 2 and 3 masked
  EXPECT_EQ(s.Sample(logits).token, 1);
  EXPECT_EQ(s.Sample(logits).token, 1);
  EXPECT_EQ(s.Sample(logits).token, 2);  // three generated: the end token is allowed again
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesFollowOpenAiFormula) {
  // logit - count * frequency - (count > 0) * presence, over generated tokens only.
  const std::vector<float> logits = {5.0f, 4.2f, 0.0f};
  // Token 0 in the prompt does not count: the first draw is still 0.
  const std::vector<int32_t> prompt = {0, 0, 0};
  Sampler s({.presence_penalty = 0.5f, .frequency_penalty = 0.4f}, prompt);
  EXPECT_EQ(s.Sample(logits).token, 0);  // 5 > 4.2
  EXPECT_EQ(s.Sample(logits).token, 1);  // 5 - 0.9 = 4.1 < 4.2
  EXPECT_EQ(s.Sample(logits).token, 0);  // 4.1 > 4.2 - 0.9 = 3.3
  EXPECT_EQ(s.Sample(logits).token, 0);  // 5 - 0.5 - 2 * 0.4 = 3.7 > 3.3
}

TEST(SamplerTest, RepetitionPenaltyCoversThePromptAndDividesPositiveLogits) {
  const std::vector<float> logits = {4.0f, 3.0f, -1.0f, -1.5f};
  const std::vector<int32_t> prompt = {0, 0, 2};
  // 4 / 1.5 = 2.67 < 3: token 1 wins although 0 is the raw argmax.
  Sampler s({.repetition_penalty = 1.5f}, prompt);
  EXPECT_EQ(s.Sample(logits).token, 1);
  // Now 1 is penalised too (3 / 1.5 = 2): 0 wins at 2.67.
  EXPECT_EQ(s.Sample(logits).token, 0);
  // Negative logits are multiplied: token 2 (in the prompt) -1.5 ties token 3 (-1.5): with
  // 0 and 1 banned, the lower id wins the tie.
  Sampler neg({.repetition_penalty = 1.5f, .logit_bias = {{0, -100.0f}, {1, -100.0f}}}, prompt);
  EXPECT_EQ(neg.Sample(logits).token, 2);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmaxWithTopAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  // Greedy with a bias that makes token 0 win: its logprob is still the raw one.
  Sampler s({.logit_bias = {{0, 10.0f}}, .logprobs = 3});
  const SampledToken t = s.Sample(logits);
  ASSERT_EQ(t.token, 0);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(t.logprob, 1.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 1);  // ties: lower id first
  EXPECT_EQ(t.top[1].token, 3);
  EXPECT_EQ(t.top[2].token, 2);
  EXPECT_NEAR(t.top[0].logprob, 3.0 - std::log(z), 1e-5);
  EXPECT_NEAR(t.top[2].logprob, 2.0 - std::log(z), 1e-5);
  // logprobs = 0: the chosen token's value only; -1 (default): nothing.
  Sampler zero({.logprobs = 0});
  const SampledToken z0 = zero.Sample(logits);
  EXPECT_TRUE(z0.top.empty());
  EXPECT_NEAR(z0.logprob, 3.0 - std::log(z), 1e-5);
  Sampler none({});
  EXPECT_EQ(none.Sample(logits).logprob, 0.0f);
}

TEST(SamplerTest, ValidateChecksTheAdjustments) {
  EXPECT_FALSE(SamplingParams{.presence_penalty = 2.5f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.repetition_penalty = 0.0f}.Validate().ok());
  EXPECT_FALSE((SamplingParams{.logit_bias = {{1, 101.0f}}}.Validate().ok()));
  EXPECT_FALSE((SamplingParams{.logit_bias = {{1, 1.0f}, {1, 2.0f}}}.Validate().ok()));
  EXPECT_FALSE(SamplingParams{.min_tokens = -1}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.logprobs = 21}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.stop_token_ids = {7}}.ValidateTokens(5).ok());
  EXPECT_FALSE((SamplingParams{.logit_bias = {{-1, 1.0f}}}.ValidateTokens(5).ok()));
  EXPECT_TRUE(
      (SamplingParams{.logit_bias = {{4, 1.0f}}, .stop_token_ids = {0}}.ValidateTokens(5).ok()));
}

// Allows odd ids only; finished once `limit` tokens were accepted.
class OddOnly : public TokenConstraint {
 public:
  explicit OddOnly(int limit, int* accepted) : limit_(limit), accepted_(accepted) {}
  bool Allows(int32_t token) const override { return token % 2 == 1; }
  void Accept(int32_t) override { ++*accepted_; }
  bool Finished() const override { return *accepted_ >= limit_; }

 private:
  int limit_;
  int* accepted_;
};

TEST(SamplerTest, ConstraintRestrictsGreedyAndSampledDraws) {
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::cos(0.3f * i) * 4.0f;
  logits[42] = 50.0f;  // an even argmax far ahead of the rest
  int accepted = 0;
  Sampler greedy({}, {}, {}, std::make_unique<OddOnly>(3, &accepted));
  const int32_t g = greedy.Sample(logits).token;
  EXPECT_EQ(g % 2, 1);
  int32_t best_odd = 1;
  for (int32_t i = 1; i < 100; i += 2) {
    if (logits[i] > logits[best_odd]) best_odd = i;
  }
  EXPECT_EQ(g, best_odd);
  EXPECT_FALSE(greedy.ConstraintFinished());
  greedy.Sample(logits);
  greedy.Sample(logits);
  EXPECT_TRUE(greedy.ConstraintFinished());
  EXPECT_EQ(accepted, 3);

  int unused = 0;
  Sampler hot({.temperature = 1.5f, .seed = 3}, {}, {},
              std::make_unique<OddOnly>(1 << 30, &unused));
  std::map<int32_t, int> seen;
  for (int i = 0; i < 3000; ++i) seen[hot.Sample(logits).token]++;
  for (const auto& [id, count] : seen) EXPECT_EQ(id % 2, 1) << id;
  EXPECT_GT(seen.size(), 10u);  // a distribution, not one token
  // top_k keeping only even ids: the most likely allowed token is taken.
  logits[40] = 49.0f;
  Sampler narrow({.temperature = 1.0f, .top_k = 2, .seed = 1}, {}, {},
                 std::make_unique<OddOnly>(1 << 30, &unused));
  EXPECT_EQ(narrow.Sample(logits).token, best_odd);
}

}  // namespace
}  // namespace tandem::engine
