#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include "engine/kv_cache.h"

namespace tandem::engine {
namespace {

// Shapes of the two shipped models (their GGUF headers), without loading them.
model::ModelConfig SmolLm2Shape() {
  model::ModelConfig c;
  c.n_layers = 30;
  c.dim = 576;
  c.ffn_dim = 1536;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.rope_dim = 64;
  c.vocab_size = 49152;
  c.context_length = 8192;
  return c;
}

model::ModelConfig GemmaShape() {
  model::ModelConfig c;
  c.n_layers = 18;
  c.dim = 640;
  c.ffn_dim = 2048;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 256;
  c.rope_dim = 256;
  c.vocab_size = 262144;
  c.context_length = 32768;
  c.sliding_window = 512;
  c.sliding_layers.assign(c.n_layers, true);
  for (int l = 5; l < c.n_layers; l += 6) c.sliding_layers[l] = false;  // 3 global layers
  return c;
}

MemoryPlanInputs Inputs(int64_t kv_tokens) {
  MemoryPlanInputs in;
  in.model_file_bytes = 100 << 20;
  in.engine.threads = 2;
  in.engine.block_tokens = 16;
  in.engine.max_sequences = 32;
  in.engine.max_step_tokens = 256;
  in.engine.kv_capacity_tokens = static_cast<int>(kv_tokens);
  in.kv_pool_bytes = 64 << 20;
  return in;
}

TEST(MemoryPlan, PartsAddUpAndTheKvPartIsTheCacheItself) {
  for (const model::ModelConfig& c : {SmolLm2Shape(), GemmaShape()}) {
    const MemoryPlanInputs in = Inputs(32768);
    const MemoryPlan plan = PlanMemory(c, in);
    int64_t sum = 0;
    for (const MemoryPart& p : plan.parts) {
      EXPECT_GE(p.bytes, 0) << p.name;
      sum += p.bytes;
    }
    EXPECT_EQ(plan.total(), sum);
    EXPECT_EQ(plan.bytes_of("kv"),
              static_cast<int64_t>(PagedKvCache::RequiredBytes(KvShapeFor(c, in.engine, 32768))));
    EXPECT_GE(plan.bytes_of("weights"), in.model_file_bytes);
    EXPECT_EQ(plan.bytes_of("kv_pool"), in.kv_pool_bytes);
    EXPECT_EQ(plan.bytes_of("no such part"), 0);
    EXPECT_NE(plan.ToString().find("kv "), std::string::npos);
  }
}

TEST(MemoryPlan, LogitsAreBoundedByTheRowsOneStepWrites) {
  // One fp32 row per running sequence plus the prompt-logprob rows, each vocab wide.
  const model::ModelConfig c = GemmaShape();
  MemoryPlanInputs in = Inputs(4096);
  const int64_t at32 = PlanMemory(c, in).bytes_of("logits");
  EXPECT_GE(at32, int64_t{MaxLogitRows(32)} * c.vocab_size * 4);
  in.engine.max_sequences = 64;
  EXPECT_EQ(PlanMemory(c, in).bytes_of("logits") - at32, int64_t{32} * (c.vocab_size + c.dim) * 4);
}

TEST(MemoryPlan, KvTokensWithinFillTheBudgetToTheBlock) {
  for (const model::ModelConfig& c : {SmolLm2Shape(), GemmaShape()}) {
    MemoryPlanInputs in = Inputs(0);
    const int64_t budget = PlanMemory(c, in).total() + (300 << 20);
    const int64_t tokens = KvTokensWithin(budget, c, in);
    ASSERT_GT(tokens, 0);
    EXPECT_EQ(tokens % in.engine.block_tokens, 0);
    in.engine.kv_capacity_tokens = static_cast<int>(tokens);
    EXPECT_LE(PlanMemory(c, in).total(), budget);
    in.engine.kv_capacity_tokens = static_cast<int>(tokens + in.engine.block_tokens);
    EXPECT_GT(PlanMemory(c, in).total(), budget) << "one more block would still have fitted";
  }
}

TEST(MemoryPlan, SlidingLayersMakeLongContextsCheap) {
  // Per position Gemma pays 3 global layers x 1 KiB (plus a window arena of fixed size),
  // SmolLM2 30 layers x 768 bytes: with two sequences at a time (a window arena of about 100
  // window blocks of 240 KiB), 300 MiB of KV hold over 64k Gemma positions, < 32k SmolLM2.
  // (With 32 sequences the arena alone would take about 260 MiB.)
  MemoryPlanInputs in = Inputs(0);
  in.engine.max_sequences = 2;
  const int64_t gemma =
      KvTokensWithin(PlanMemory(GemmaShape(), in).total() + (300 << 20), GemmaShape(), in);
  const int64_t smol =
      KvTokensWithin(PlanMemory(SmolLm2Shape(), in).total() + (300 << 20), SmolLm2Shape(), in);
  EXPECT_GT(gemma, 2 * 32768) << "two 32k Gemma sequences fit in 300 MiB of KV";
  EXPECT_LT(smol, 32768);
}

TEST(MemoryPlan, ABudgetBelowTheFixedPartsHoldsNoKv) {
  const model::ModelConfig c = SmolLm2Shape();
  const MemoryPlanInputs in = Inputs(0);
  EXPECT_EQ(KvTokensWithin(PlanMemory(c, in).total(), c, in), 0);
  EXPECT_EQ(KvTokensWithin(0, c, in), 0);
  EXPECT_EQ(KvTokensWithin(-1, c, in), 0);
}

}  // namespace
}  // namespace tandem::engine
