#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace tandem::engine {
namespace {

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
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
    const int32_t x = a.Sample(logits);
    EXPECT_EQ(x, b.Sample(logits));
    differ += x != c.Sample(logits);
  }
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> logits = {5.0f, 4.0f, 3.0f, 0.0f, -2.0f, -5.0f};
  auto support = [&](SamplingParams p) {
    Sampler s(p);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 4000; ++i) seen[s.Sample(logits)]++;
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
  for (int i = 0; i < n; ++i) ones += s.Sample(logits) == 1;
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

TEST(SamplerTest, SkipContinuesTheSameStreamOfDraws) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 1234;
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i) * 3.0f;
  Sampler whole(p);
  std::vector<int32_t> expect;
  for (int i = 0; i < 40; ++i) expect.push_back(whole.Sample(logits));
  // A second sampler skips the first 7 draws and must continue identically.
  Sampler continued(p);
  continued.Skip(7);
  for (int i = 7; i < 40; ++i) EXPECT_EQ(continued.Sample(logits), expect[i]) << "draw " << i;
}

}  // namespace
}  // namespace tandem::engine
