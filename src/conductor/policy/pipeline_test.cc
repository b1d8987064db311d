#include "conductor/policy/pipeline.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tandem::conductor {
namespace {

CostModel Cost() {
  CostModel c;
  c.prefill_per_token_s = 1e-3;
  c.prefill_attention_s = 1e-7;
  c.decode_base_s = 0.01;
  return c;
}

// Gemma 3 270M's layer kinds: 18 layers, every sixth global, the others sliding over 512.
std::vector<int> GemmaWindows() {
  std::vector<int> w(18, 512);
  for (int l = 5; l < 18; l += 6) w[l] = 0;
  return w;
}

TEST(PipelineSplitTest, LayerCostsFollowTheirWindows) {
  const auto windows = GemmaWindows();
  const auto s = LayerSeconds(Cost(), 18, windows, 32768);
  // Matmuls 1e-3 * 32768 / 18 = 1.82 s each; a global layer adds 1e-7 * 32768 * 32769 / 2 / 18
  // = 2.98 s of attention, a sliding one 1e-7 * (512 * 513 / 2 + 32256 * 512) / 18 = 0.093 s.
  EXPECT_NEAR(s[5], 1.820 + 2.983, 0.01);
  EXPECT_NEAR(s[0], 1.820 + 0.092, 0.01);
  // Short prompts do not reach the window: every layer costs the same.
  const auto short_prompt = LayerSeconds(Cost(), 18, windows, 300);
  EXPECT_DOUBLE_EQ(short_prompt[0], short_prompt[5]);
}

TEST(PipelineSplitTest, BalancesPredictedTimeNotLayerCounts) {
  const auto windows = GemmaWindows();
  const LayerSplit split = SplitLayers(Cost(), 18, windows, 32768, 2, 1024);
  ASSERT_EQ(split.bounds.size(), 3u);
  EXPECT_EQ(split.bounds.front(), 0);
  EXPECT_EQ(split.bounds.back(), 18);
  // Global layers 5, 11 and 17 (4.80 s each), sliding ones 1.91 s: one global layer and nine
  // sliding ones (22.0 s) against two and six (21.1 s), not nine layers each (20.1 / 23.0 s).
  EXPECT_EQ(split.bounds[1], 10);
  const double total = std::accumulate(split.stage_seconds.begin(), split.stage_seconds.end(), 0.0);
  EXPECT_NEAR(total, split.single_seconds, 1e-9);
  // No other cut has a faster slowest stage.
  const auto per = LayerSeconds(Cost(), 18, windows, 32768);
  const double slowest = std::max(split.stage_seconds[0], split.stage_seconds[1]);
  for (int cut = 1; cut < 18; ++cut) {
    const double a = std::accumulate(per.begin(), per.begin() + cut, 0.0);
    EXPECT_GE(std::max(a, total - a) + 1e-12, slowest) << "cut " << cut;
  }
  // 32 chunks: the pipeline costs the slowest stage plus 1/32 of the rest.
  EXPECT_NEAR(split.pipelined_seconds, slowest + (total - slowest) / 32, 1e-9);
  EXPECT_LT(split.pipelined_seconds, 0.6 * split.single_seconds);
}

TEST(PipelineSplitTest, UniformLayersSplitEvenlyAndStagesAreBounded) {
  const LayerSplit three = SplitLayers(Cost(), 30, {}, 4096, 3, 512);
  EXPECT_EQ(three.bounds, (std::vector<int>{0, 10, 20, 30}));
  const LayerSplit too_many = SplitLayers(Cost(), 2, {}, 4096, 5, 512);
  EXPECT_EQ(too_many.bounds, (std::vector<int>{0, 1, 2}));
  const LayerSplit one = SplitLayers(Cost(), 30, {}, 4096, 1, 512);
  EXPECT_EQ(one.bounds, (std::vector<int>{0, 30}));
  EXPECT_NEAR(one.pipelined_seconds, one.single_seconds, 1e-9);
}

TEST(PipelineSplitTest, ShorterPromptsGetSmallerChunks) {
  EXPECT_EQ(PipelineChunkTokens(32000, 1024), 1024);  // 32 chunks
  EXPECT_EQ(PipelineChunkTokens(4000, 1024), 256);    // 16 chunks of 250, rounded up to 16
  EXPECT_EQ(PipelineChunkTokens(1000, 1024), 128);    // not below 128
  EXPECT_EQ(PipelineChunkTokens(1000, 40), 40);       // never above the chosen chunk
}

}  // namespace
}  // namespace tandem::conductor
