#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/kv_cache.h"

namespace tandem::engine {

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The runtime allowance: what a loaded process holds beyond the parts computed here, measured
// as peak RSS minus those parts for SmolLM2-135M (49,152 tokens) and Gemma 3 270M (262,144
// tokens) serving colocated and as workers (docs/design/engine.md, "Memory plan"), then rounded
// up: a fixed part and a part per vocabulary entry (token strings, scores, merge tables).
constexpr int64_t kRuntimeFixedBytes = 48 * kMiB;
constexpr int64_t kRuntimeBytesPerVocabEntry = 160;

// Per-thread scratch of the matmul (activation quantization and weight-panel packing) and of
// the attention kernels, for a step of `tokens` tokens: quantized activations (one byte per
// element plus scales) of the widest input, twice, and a few tiles of fp32 scores and outputs.
int64_t KernelScratchPerThread(const model::ModelConfig& c, int64_t tokens) {
  const int64_t widest = std::max({c.dim, c.ffn_dim, c.q_dim()});
  return 2 * tokens * (widest + widest / 8) + 4 * kMiB;
}

int StepTokens(const EngineOptions& e) {
  return e.max_step_tokens > 0 ? e.max_step_tokens : e.prefill_chunk;
}

MemoryPlan PlanWith(const model::ModelConfig& c, const MemoryPlanInputs& in, int64_t kv_bytes) {
  const EngineOptions& e = in.engine;
  const int64_t T = std::max(1, StepTokens(e));
  const int64_t threads = std::max({1, e.threads, e.max_threads});  // each may get scratch
  const int64_t sequences = std::max(1, e.max_sequences);
  const int64_t f = sizeof(float);

  // The norms ModelWeights copies as floats: per layer attention and FFN norms, the post norms,
  // the per-head Q/K norms; the output norm.
  const int64_t norms = f * (c.n_layers * (4 * int64_t{c.dim} + 2 * c.head_dim) + c.dim);
  // Transformer scratch (transformer.h): x, xn (T, dim); q, attn (T, q_dim); k, v (T, kv_dim);
  // gate, up (T, ffn); two RoPE tables of cos and sin (T, rope_dim / 2); positions and items.
  const int64_t per_token = f * (2 * int64_t{c.dim} + 2 * c.q_dim() + 2 * c.kv_dim() +
                                 2 * int64_t{c.ffn_dim} + 2 * c.rope_dim) +
                            2 * sizeof(int32_t);
  const int64_t activations = T * per_token + threads * KernelScratchPerThread(c, T);
  const int64_t rows = MaxLogitRows(static_cast<int>(sequences));
  const int64_t logits = rows * (int64_t{c.vocab_size} + c.dim) * f;
  // Sampler scratch (sampler.cc: five vocab-sized vectors, one of (id, logit) pairs) and the
  // logprobs exponentials, on every thread that samples (the engine's pool).
  const int64_t sampling = threads * int64_t{c.vocab_size} * (7 * f);
  const int64_t runtime = kRuntimeFixedBytes + int64_t{c.vocab_size} * kRuntimeBytesPerVocabEntry;

  MemoryPlan plan;
  plan.parts = {{"weights", in.model_file_bytes + norms},
                {"kv", kv_bytes},
                {"activations", activations},
                {"logits", logits},
                {"sampling", sampling},
                {"kv_pool", in.kv_pool_bytes},
                {"runtime", runtime}};
  return plan;
}

}  // namespace

int64_t MemoryPlan::total() const {
  int64_t sum = 0;
  for (const MemoryPart& p : parts) sum += p.bytes;
  return sum;
}

int64_t MemoryPlan::bytes_of(const std::string& name) const {
  for (const MemoryPart& p : parts) {
    if (p.name == name) return p.bytes;
  }
  return 0;
}

std::string MemoryPlan::ToString() const {
  std::string out;
  for (const MemoryPart& p : parts) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {:.1f} MiB", p.name, static_cast<double>(p.bytes) / kMiB);
  }
  return out;
}

MemoryPlan PlanMemory(const model::ModelConfig& config, const MemoryPlanInputs& in) {
  const KvCacheShape shape = KvShapeFor(config, in.engine, in.engine.kv_capacity_tokens);
  return PlanWith(config, in, static_cast<int64_t>(PagedKvCache::RequiredBytes(shape)));
}

int64_t KvTokensWithin(int64_t budget_bytes, const model::ModelConfig& config,
                       const MemoryPlanInputs& in) {
  const int64_t left = budget_bytes - PlanWith(config, in, 0).total();
  const int bt = std::max(1, in.engine.block_tokens);
  // RequiredBytes grows with the blocks (and, with sliding layers, the window arena up to one
  // window block per block): search the largest block count that fits.
  auto bytes_for = [&](int64_t blocks) {
    return static_cast<int64_t>(
        PagedKvCache::RequiredBytes(KvShapeFor(config, in.engine, blocks * bt)));
  };
  if (left <= 0 || bytes_for(1) > left) return 0;
  int64_t lo = 1, hi = 2;
  while (hi < (int64_t{1} << 26) / bt && bytes_for(hi) <= left) hi *= 2;
  while (hi - lo > 1) {  // bytes_for(lo) <= left < bytes_for(hi), or hi at the cap
    const int64_t mid = lo + (hi - lo) / 2;
    (bytes_for(mid) <= left ? lo : hi) = mid;
  }
  if (bytes_for(hi) <= left) lo = hi;
  return lo * bt;
}

}  // namespace tandem::engine
