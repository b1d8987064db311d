// The memory an engine process needs, part by part, known before it starts: memory is budgeted,
// never discovered. A server given a budget (`serve --memory-budget-mb`) sizes its KV cache
// from what the other parts leave, and admits only what that cache holds; so the process never
// grows past its plan whatever the load (8 concurrent 32k prompts wait for KV, they do not
// allocate more).
//
//   MemoryPlanInputs in{.model_file_bytes = file.size(), .engine = eo, .max_sequences = 32};
//   const MemoryPlan plan = PlanMemory(config, in);          // with eo.kv_capacity_tokens
//   const int64_t kv_tokens = KvTokensWithin(budget, config, in);
//
// Parts (bytes; every figure is an upper bound for the process's resident set):
//   weights      the mapped GGUF file (every tensor is read, so every page becomes resident)
//                plus the norms copied to the heap as floats; a matrix interleaved for the
//                kernels (engine/model_weights.h) is a copy of the same size whose source pages
//                are released, so it stays within this figure
//   kv           the paged KV cache (engine::PagedKvCache::RequiredBytes), window arena included
//   activations  the transformer's scratch for the largest step (max_step_tokens tokens)
//   logits       the rows of vocab logits one step writes (MaxLogitRows) and their inputs
//   sampling     per sampling thread: vocab-sized scratch of the sampler and of logprobs
//   kv_pool      the shared-memory segment the worker lends to the cluster KV pool (resident
//                only as it fills)
//   runtime      libraries, tokenizer tables, thread stacks, the HTTP and control servers and
//                allocator slack: a fixed allowance plus the tokenizer's size, measured
//                (docs/design/engine.md, "Memory plan")
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model_config.h"

namespace tandem::engine {

// Rows of prompt logprobs (BatchItem::all_logits) one forward step computes at most, over all
// its items: a prompt asking for them is computed in chunks of at most this many tokens, so the
// logits buffer is bounded (a 262k vocabulary makes each row 1 MiB).
inline constexpr int kPromptLogprobRowsPerStep = 64;

// Rows of logits one step produces at most with `max_sequences` sequences running: one per
// sequence plus the prompt-logprob rows.
inline int MaxLogitRows(int max_sequences) { return max_sequences + kPromptLogprobRowsPerStep; }

struct MemoryPlanInputs {
  int64_t model_file_bytes = 0;
  // threads, block_tokens, kv_capacity_tokens, max_sequences and max_step_tokens (or
  // prefill_chunk) are read; max_sequences 0 counts as 1.
  EngineOptions engine;
  int64_t kv_pool_bytes = 0;  // shared memory lent to the KV pool (0: none)
};

struct MemoryPart {
  std::string name;  // "weights", "kv", "activations", "logits", "sampling", "kv_pool", "runtime"
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<MemoryPart> parts;  // in the order above
  int64_t total() const;
  int64_t bytes_of(const std::string& name) const;  // 0 if absent
  std::string ToString() const;                     // "weights 253.0 MiB, kv 96.0 MiB, ..."
};

MemoryPlan PlanMemory(const model::ModelConfig& config, const MemoryPlanInputs& in);

// The most KV positions (in whole blocks) a process of `budget_bytes` can hold after every other
// part of its plan; 0 when the budget does not even hold those.
int64_t KvTokensWithin(int64_t budget_bytes, const model::ModelConfig& config,
                       const MemoryPlanInputs& in);

}  // namespace tandem::engine
