// The in-process backend: one engine driven by a continuous-batching loop on its own thread,
// with KV-capacity admission, chunked prefill mixed into decode steps, preemption by recompute
// and a local prefix cache.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "serving/backend.h"

namespace tandem::serving {

struct SchedulerOptions {
  int max_num_seqs = 32;          // running sequences at most
  int max_batch_tokens = 256;     // tokens per forward step (prefill chunks + decodes)
  int max_waiting = 256;          // queued requests beyond this get ResourceExhausted (429)
  bool enable_prefix_cache = true;
};

// engine must outlive the backend. The loop thread starts immediately.
std::unique_ptr<GenerationBackend> MakeLocalBackend(engine::Engine* engine,
                                                    const SchedulerOptions& options);

}  // namespace tandem::serving
