#include "conductor/policy/cost_model.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::conductor {
namespace {

CostModel Truth() {
  CostModel m;
  m.prefill_base_s = 0.004;
  m.prefill_per_token_s = 0.0008;
  m.prefill_attention_s = 2e-8;
  m.decode_base_s = 0.012;
  m.decode_per_seq_s = 0.0005;
  m.decode_per_context_token_s = 3e-7;
  return m;
}

TEST(CostModelTest, FitRecoversExactCoefficients) {
  const CostModel t = Truth();
  std::vector<PrefillSample> p;
  for (auto [n, c] : {std::pair{16, 0}, {64, 0}, {192, 0}, {384, 0}, {64, 256}, {128, 384}}) {
    p.push_back({n, c, t.PrefillSeconds(n, c)});
  }
  std::vector<DecodeSample> d;
  for (auto [b, ctx] : {std::pair{1, 65}, {4, 260}, {16, 1040}, {1, 513}, {4, 2052}, {16, 8208}}) {
    d.push_back({b, ctx, t.DecodeStepSeconds(b, ctx)});
  }
  auto m = FitCostModel(p, d);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // Exact data: the fit reproduces every sample to rounding (relative 1e-6).
  for (const auto& s : p)
    EXPECT_NEAR(m->PrefillSeconds(s.new_tokens, s.cached_tokens), s.seconds, s.seconds * 1e-6);
  for (const auto& s : d)
    EXPECT_NEAR(m->DecodeStepSeconds(s.batch, s.context_tokens), s.seconds, s.seconds * 1e-6);
  EXPECT_NEAR(m->decode_base_s, t.decode_base_s, 1e-9);
  EXPECT_NEAR(m->prefill_per_token_s, t.prefill_per_token_s, 1e-9);
}

TEST(CostModelTest, MixedStepPaysTheLongerOfWeightsAndChunkMatmuls) {
  const CostModel t = Truth();
  const CostModel::Chunk big[] = {{100, 50}};  // linear 80 ms > d0 12 ms
  const CostModel::Chunk small[] = {{5, 0}};   // linear 4 ms < d0
  EXPECT_EQ(t.MixedStepSeconds(0, 0, {}), 0);
  // Alone, chunks are a prefill: each chunk's cost, one base.
  EXPECT_NEAR(t.MixedStepSeconds(0, 0, big), t.PrefillSeconds(100, 50), 1e-12);
  const CostModel::Chunk two[] = {{100, 50}, {5, 0}};
  EXPECT_NEAR(t.MixedStepSeconds(0, 0, two),
              t.PrefillSeconds(100, 50) + t.PrefillSeconds(5, 0) - t.prefill_base_s, 1e-12);
  // Beside decoding sequences: the decode step without its base, plus the longer of the base
  // and the chunks' linear part, plus their attention.
  const double decode_rest = t.DecodeStepSeconds(4, 1000) - t.decode_base_s;
  EXPECT_NEAR(t.MixedStepSeconds(4, 1000, big),
              decode_rest + 100 * t.prefill_per_token_s + t.prefill_attention_s * 100 * 100, 1e-12);
  EXPECT_NEAR(t.MixedStepSeconds(4, 1000, small),
              t.DecodeStepSeconds(4, 1000) + t.prefill_attention_s * 5 * 2.5, 1e-12);
  EXPECT_NEAR(t.MixedStepSeconds(4, 1000, {}), t.DecodeStepSeconds(4, 1000), 1e-12);
}

TEST(CostModelTest, NegativeCoefficientsAreDroppedNotKept) {
  // Decode steps that get faster with context (noise) must not yield a negative coefficient.
  std::vector<PrefillSample> p = {{16, 0, 0.02}, {64, 0, 0.06}, {256, 0, 0.22}};
  std::vector<DecodeSample> d = {
      {1, 100, 0.0110}, {1, 1000, 0.0100}, {8, 800, 0.0150}, {8, 8000, 0.0140}};
  auto m = FitCostModel(p, d);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GE(m->decode_per_context_token_s, 0);
  EXPECT_GE(m->decode_per_seq_s, 0);
  EXPECT_GE(m->decode_base_s, 0);
  EXPECT_GT(m->DecodeStepSeconds(8, 800), m->DecodeStepSeconds(1, 100));
}

TEST(CostModelTest, TooFewSamplesIsAnError) {
  std::vector<PrefillSample> p = {{16, 0, 0.02}};
  std::vector<DecodeSample> d = {{1, 100, 0.01}, {2, 100, 0.011}, {4, 100, 0.012}};
  EXPECT_EQ(FitCostModel(p, d).status().code(), StatusCode::kInvalidArgument);
}

TEST(CostModelTest, JsonRoundTripAndBadInput) {
  CostModel t = Truth();
  t.model = "m.gguf";
  t.threads = 3;
  t.cpu = "cpu";
  auto back = CostModel::FromJson(t.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->decode_per_context_token_s, t.decode_per_context_token_s);
  EXPECT_EQ(back->model, "m.gguf");
  EXPECT_EQ(back->threads, 3);
  EXPECT_FALSE(CostModel::FromJson("[]").ok());
  EXPECT_FALSE(CostModel::FromJson("{\"prefill_base_s\": 1}").ok());
  EXPECT_FALSE(CostModel::FromJson("not json").ok());
  std::string negative = t.ToJson();
  negative.replace(negative.find("\"decode_base_s\":"), 16, "\"decode_base_s\":-");
  EXPECT_FALSE(CostModel::FromJson(negative).ok());
}

}  // namespace
}  // namespace tandem::conductor
