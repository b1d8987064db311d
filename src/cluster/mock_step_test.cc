// A mock engine's step times (cluster/mock_step.h): the profile's formula over a batch, and a
// whole mock engine that, timed by the worker's own calibration, gives its profile back.
#include "cluster/mock_step.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "cluster/calibration.h"
#include "engine/engine.h"

namespace tandem::cluster {
namespace {

conductor::CostModel Profile() {
  conductor::CostModel m;
  m.prefill_base_s = 0.003;
  m.prefill_per_token_s = 4e-5;
  m.prefill_attention_s = 1e-8;
  m.decode_base_s = 0.004;
  m.decode_per_seq_s = 2e-4;
  m.decode_per_context_token_s = 1e-6;
  return m;
}

TEST(MockStepTest, OneTokenItemsDecodeAndLongerOnesArePromptChunks) {
  const conductor::CostModel m = Profile();
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  const std::vector<int32_t> one = {5}, chunk(40, 7);
  const engine::BatchItem decode_a{blocks, 10, one, true}, decode_b{blocks, 30, one, true};
  const engine::BatchItem prompt{blocks, 8, chunk, true};
  EXPECT_EQ(MockStepSeconds(m, {}), 0);
  const engine::BatchItem decodes[] = {decode_a, decode_b};
  EXPECT_DOUBLE_EQ(MockStepSeconds(m, decodes), m.DecodeStepSeconds(2, 11 + 31));
  EXPECT_DOUBLE_EQ(MockStepSeconds(m, {&prompt, 1}), m.PrefillSeconds(40, 8));
  const engine::BatchItem mixed[] = {decode_a, prompt, decode_b};
  const conductor::CostModel::Chunk chunks[] = {{40, 8}};
  EXPECT_DOUBLE_EQ(MockStepSeconds(m, mixed), m.MixedStepSeconds(2, 42, chunks));
  EXPECT_DOUBLE_EQ(MockStepFunction(m)(mixed), MockStepSeconds(m, mixed));
}

TEST(MockStepTest, AMockEngineCalibratesToItsProfile) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  engine::EngineOptions o;
  o.model_path = std::string(src ? src : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.kv_capacity_tokens = 16384;  // room for every calibration point (16 x 512 tokens)
  const conductor::CostModel truth = Profile();
  o.mock_step_seconds = MockStepFunction(truth);
  auto e = engine::Engine::Load(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // Its KV keeps the model's layers and blocks, one value per K and V.
  EXPECT_EQ((*e)->kv().shape().n_layers, (*e)->config().n_layers);
  EXPECT_EQ((*e)->kv().shape().head_dim, 1);

  // Generation runs to max_tokens on one ordinary token.
  const std::vector<int32_t> prompt = (*e)->tokenizer().Encode("Hello there", true, false);
  engine::GenerateOptions go;
  go.max_tokens = 6;
  auto out = (*e)->Generate(prompt, go, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->tokens.size(), 6u);
  EXPECT_EQ(out->finish_reason, "length");
  for (int32_t t : out->tokens) EXPECT_EQ(t, out->tokens.front());
  EXPECT_FALSE((*e)->tokenizer().IsEndOfGeneration(out->tokens.front()));
  EXPECT_GE(out->decode_seconds,
            5 * truth.DecodeStepSeconds(1, static_cast<int64_t>(prompt.size())));

  // Timed as the worker times a real engine, the mock gives back its profile's predictions.
  // The sleeps overshoot by scheduling latency (~0.1 ms, more on a busy machine): tolerance
  // 1 ms + 10% of the prediction, and each point is the fastest of 3 runs, so that one late
  // wake-up (another test busy on both cores) does not stand for the point.
  CalibrationOptions co;
  co.max_batch_tokens = 256;
  co.repeats = 3;
  auto fitted = Calibrate(**e, co);
  ASSERT_TRUE(fitted.ok()) << fitted.status().ToString();
  for (int64_t n : {16, 128, 256}) {
    const double want = truth.PrefillSeconds(n, 0);
    EXPECT_NEAR(fitted->PrefillSeconds(n, 0), want, 0.001 + 0.1 * want) << n << " tokens";
  }
  for (int64_t b : {1, 8, 32}) {
    const double want = truth.DecodeStepSeconds(b, b * 200);
    EXPECT_NEAR(fitted->DecodeStepSeconds(b, b * 200), want, 0.001 + 0.1 * want) << "batch " << b;
  }
}

}  // namespace
}  // namespace tandem::cluster
