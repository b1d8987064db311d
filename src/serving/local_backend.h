// The in-process backend: one engine driven by a continuous-batching loop on its own thread,
// with KV-capacity admission, chunked prefill mixed into decode steps, preemption by recompute
// and a local prefix cache.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "serving/backend.h"
#include "serving/kv_pool.h"

namespace tandem::serving {

struct SchedulerOptions {
  int max_num_seqs = 32;       // running sequences at most
  int max_batch_tokens = 256;  // tokens per forward step (prefill chunks + decodes)
  int max_waiting = 256;       // queued requests beyond this get ResourceExhausted (429)
  bool enable_prefix_cache = true;
  // The cluster's KV pool behind the local prefix cache (needs enable_prefix_cache): asked for
  // what the local cache lacks of each prompt, offered every finished sequence's full blocks.
  // Null: local cache only. With sliding-window layers it holds windows too (kv_pool.h).
  std::shared_ptr<KvPool> kv_pool = nullptr;
  // For the memory plan in Stats() (engine/memory_plan.h): the budget the process was sized to
  // (0: none) and the shared memory it lends to the KV pool.
  int64_t memory_budget_bytes = 0;
  int64_t kv_pool_bytes = 0;
};

// Told, on the loop thread, as soon as each layer of a forward step has written a sequence's
// KV: the prefill side of disaggregation starts moving that layer while the next ones compute.
class KvObserver {
 public:
  virtual ~KvObserver() = default;
  // `layer` now holds the KV of positions [first_pos, end_pos) of the sequence whose block
  // table (position order, block_tokens positions per block) is `blocks`. Positions below
  // first_pos were written by earlier steps or came from the prefix cache.
  virtual void OnLayerWritten(int layer, std::span<const int32_t> blocks, int first_pos,
                              int end_pos) = 0;
};

// The in-process backend with the hooks that disaggregated workers use.
//
// Thread-safety: every method may be called from any thread. One loop thread does the work and
// calls sinks and observers, which must not call Reserve*/SubmitPrefilled (those wait for it).
class LocalBackend : public GenerationBackend {
 public:
  // Prefill side: Submit, plus an observer of the request's KV writes (kept until it finishes).
  virtual Status SubmitObserved(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                                std::shared_ptr<KvObserver> observer) = 0;

  // Decode side, step 1: reserves KV blocks for `n_tokens` positions under `id` (evicting
  // cached prefix blocks if needed) and returns them in position order, with window storage
  // for the sliding layers' last window. ResourceExhausted if the cache cannot hold them now;
  // the reservation is freed at `expires` unless claimed by SubmitPrefilled, and counted in
  // Stats().reservations_expired.
  struct Reserved;
  virtual StatusOr<Reserved> ReserveBlocks(const std::string& id, int n_tokens,
                                           Clock::time_point expires) = 0;
  // Decode side, step 1 with prefix reuse: like ReserveBlocks for n_tokens positions of a
  // sequence starting with `prompt`, but the leading full blocks of the prompt that the prefix
  // cache holds are taken from it (at most (prompt.size() - 1) / block_tokens of them, so that
  // at least one block is left to write). Returns the blocks and how many leading ones already
  // hold the prompt's KV.
  struct Reserved {
    std::vector<int32_t> blocks;  // position order
    int cached_blocks = 0;        // blocks[0, cached_blocks) hold the prefix already
    // Per block: its window block (sliding layers' KV, PagedKvCache), or -1 where the first
    // decode step reads no sliding KV (nothing to write there). Empty without sliding layers.
    std::vector<int32_t> window_blocks;
  };
  virtual StatusOr<Reserved> ReservePrompt(const std::string& id, std::span<const int32_t> prompt,
                                           int n_tokens, Clock::time_point expires) = 0;
  // Keys of the blocks the prefix cache holds, as of the last step (thread-safe).
  virtual std::vector<uint64_t> CachedBlockKeys() const = 0;
  // Decode side, step 2: the KV of request.prompt_tokens is in the blocks reserved under
  // request.id and `first_token` was sampled after it; continues generation from there. The
  // sink sees the tokens after first_token. NotFound if the reservation is gone.
  virtual Status SubmitPrefilled(GenerationRequest request, int32_t first_token,
                                 std::shared_ptr<GenerationSink> sink) = 0;
  // Frees a reservation not claimed (no-op if unknown or claimed).
  virtual void CancelReservation(const std::string& id) = 0;

  // What work outside the scheduler gets on the loop thread (RunExclusive): the engine to
  // itself (its transformer, KV cache and thread pool), and KV memory taken the way the
  // scheduler takes it, from cached prefix blocks when none is free.
  class ExclusiveAccess {
   public:
    virtual engine::Engine& engine() = 0;
    // n blocks, evicting prefix-cache blocks if too few are free; ResourceExhausted otherwise.
    // They are the caller's (free them with engine().kv().Release in a later RunExclusive).
    virtual StatusOr<std::vector<int32_t>> AllocateBlocks(int n) = 0;
    // Window storage for positions [first_pos, end_pos) of `table` (sliding-window models),
    // taking it back from the prefix cache and from what running sequences moved past first.
    virtual Status AttachWindow(std::span<const int32_t> table, int64_t first_pos,
                                int64_t end_pos) = 0;

   protected:
    ~ExclusiveAccess() = default;
  };

  // Runs fn on the loop thread between two steps and returns its status: work outside the
  // scheduler, such as one stage of a pipelined prefill. Its wall time counts as prefill busy
  // time of `prefill_tokens` computed tokens (Stats). DeadlineExceeded if fn has not started by
  // `deadline` (it then never runs); FailedPrecondition when the backend is shutting down.
  virtual Status RunExclusive(std::function<Status(ExclusiveAccess&)> fn, int64_t prefill_tokens,
                              Clock::time_point deadline) = 0;

  // Computes on `threads` engine threads from the next step on (elastic pools move cores
  // between workers); waits for the loop to apply it between two steps. InvalidArgument outside
  // [1, the engine's max_threads()]; Unavailable if the loop does not get to it in time.
  // Generated text does not change (the kernels are thread-count invariant).
  virtual Status SetEngineThreads(int threads) = 0;

  const engine::Engine& engine() const { return *engine_; }

 protected:
  explicit LocalBackend(engine::Engine* engine) : engine_(engine) {}
  engine::Engine* engine_;
};

// engine must outlive the backend. The loop thread starts immediately.
std::unique_ptr<LocalBackend> MakeLocalBackend(engine::Engine* engine,
                                               const SchedulerOptions& options);

}  // namespace tandem::serving
