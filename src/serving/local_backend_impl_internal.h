// The scheduler's implementation (local_backend.h has the interface), split by concern:
//   local_backend.cc            construction, Submit, reservations for prefilled KV, commands
//                               run on the loop, Stats, Drain
//   local_backend_admission.cc  the loop, deadlines, KV for each step, admission, preemption
//   local_backend_pool.cc       the cluster KV pool: fetch when it pays off, offer what was
//   computed local_backend_step.cc       one engine step, reaping finished sequences, published
//   stats
// Internal to src/serving.
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/process_memory.h"
#include "engine/memory_plan.h"
#include "serving/local_backend.h"
#include "serving/prefix_cache.h"
#include "structured/token_constraint.h"

namespace tandem::serving::internal {

inline double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One request inside the loop. Owned by the loop thread once taken from the inbox.
struct Sequence {
  GenerationRequest req;
  std::shared_ptr<GenerationSink> sink;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int n_prompt = 0;
  int n_computed = 0;           // leading tokens whose KV is in `blocks`
  std::vector<int32_t> blocks;  // KV blocks in position order (references owned)
  std::vector<uint64_t> keys;   // prefix-cache keys of the first keys.size() full blocks of
                                // tokens; tokens only grow, so keys are extended, never redone
  std::unique_ptr<engine::Sampler> sampler;
  std::shared_ptr<KvObserver> observer;  // prefill side of disaggregation; may be null
  int n_generated = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  bool admitted_once = false;
  bool prompt_offered = false;  // prompt blocks given to the prefix cache
  int pool_known = 0;           // leading blocks known to be in the KV pool (read from it)
  int preempted_tokens = 0;     // tokens it had computed when last preempted, until resumed
  bool waits_for_kv = false;    // preempted itself for KV others held: admitted again only
                                // with the window storage of its next step too
  std::vector<engine::SampledToken> prompt_lp;  // prompt logprobs gathered so far
  bool prompt_lp_sent = false;                  // the sink has them
  Clock::time_point first_scheduled{};
  Clock::time_point first_token{};
  std::optional<FinishReason> finish;
  std::string finish_message;

  int pending() const { return static_cast<int>(tokens.size()) - n_computed; }
};

// Blocks held for KV that a prefill worker is writing in (decode side).
struct Reservation {
  std::vector<int32_t> blocks;
  Clock::time_point expires;
};

class LocalBackendImpl final : public LocalBackend {
 public:
  LocalBackendImpl(engine::Engine* engine, const SchedulerOptions& options);
  ~LocalBackendImpl() override;
  Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) override
      TANDEM_EXCLUDES(mu_);
  Status SubmitObserved(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                        std::shared_ptr<KvObserver> observer) override TANDEM_EXCLUDES(mu_);
  StatusOr<Reserved> ReserveBlocks(const std::string& id, int n_tokens,
                                   Clock::time_point expires) override;
  StatusOr<Reserved> ReservePrompt(const std::string& id, std::span<const int32_t> prompt,
                                   int n_tokens, Clock::time_point expires) override;
  std::vector<uint64_t> CachedBlockKeys() const override TANDEM_EXCLUDES(keys_mu_);
  Status SubmitPrefilled(GenerationRequest request, int32_t first_token,
                         std::shared_ptr<GenerationSink> sink) override;
  void CancelReservation(const std::string& id) override;
  Status SetEngineThreads(int threads) override TANDEM_EXCLUDES(mu_);

 private:
  // Reserves n_tokens positions under `id`, the first full blocks of `prompt` (if any) from
  // the prefix cache.
  StatusOr<Reserved> Reserve(const std::string& id, std::vector<int32_t> prompt, int n_tokens,
                             Clock::time_point expires);
  Status Validate(const GenerationRequest& request) const;

  // InvalidArgument when the request's structured-output schema does not compile.
  StatusOr<std::unique_ptr<Sequence>> NewSequence(GenerationRequest request,
                                                  std::shared_ptr<GenerationSink> sink) const;

  // Every token's bytes, for structured output (built at the first such request).
  std::shared_ptr<const structured::TokenTable> TokenTable() const;
  Status CheckAcceptingLocked() const TANDEM_REQUIRES(mu_);

  // Queues fn for the loop thread (between steps).
  void PostToLoop(std::function<void()> fn) TANDEM_EXCLUDES(mu_);

  // Runs fn on the loop thread and returns its result; Unavailable if the loop does not get to
  // it within kCommandWait (a step is at most a few seconds) or is stopping.
  template <typename T>
  StatusOr<T> RunOnLoop(std::function<StatusOr<T>()> fn) TANDEM_EXCLUDES(mu_) {
    constexpr auto kCommandWait = std::chrono::seconds(30);
    auto promise = std::make_shared<std::promise<StatusOr<T>>>();
    auto future = promise->get_future();
    {
      MutexLock lock(&mu_);
      if (stop_ || draining_) return FailedPrecondition("the server is shutting down");
    }
    PostToLoop([promise, fn = std::move(fn)] { promise->set_value(fn()); });
    if (future.wait_for(kCommandWait) != std::future_status::ready) {
      return Unavailable("the engine loop did not answer in time");
    }
    return future.get();
  }

  Status RunExclusive(std::function<Status(ExclusiveAccess&)> fn, int64_t prefill_tokens,
                      Clock::time_point deadline) override TANDEM_EXCLUDES(mu_);

  // RunExclusive's view of the loop (loop thread only).
  class Access final : public ExclusiveAccess {
   public:
    explicit Access(LocalBackendImpl* b) : b_(b) {}
    engine::Engine& engine() override { return *b_->engine_; }
    StatusOr<std::vector<int32_t>> AllocateBlocks(int n) override {
      if (b_->kv_.num_free() < n) b_->prefix_cache_.Evict(n - b_->kv_.num_free());
      auto got = b_->kv_.Allocate(n);
      if (!got.ok()) {
        return ResourceExhausted("no room for " + std::to_string(n) + " KV blocks (" +
                                 std::to_string(b_->kv_.num_free()) + " free, the rest in use)");
      }
      return got;
    }
    Status AttachWindow(std::span<const int32_t> table, int64_t first_pos,
                        int64_t end_pos) override {
      return b_->AttachWindow(table, first_pos, end_pos);
    }

   private:
    LocalBackendImpl* b_;
  };
  BackendStats Stats() const override;
  void Drain(Clock::time_point deadline) override TANDEM_EXCLUDES(mu_);

 private:
  Clock::time_point NextReservationExpiry() const;
  bool ReservationDue() const { return Clock::now() >= NextReservationExpiry(); }

  void Loop() TANDEM_EXCLUDES(mu_);
  void CancelAll(const std::string& why) TANDEM_EXCLUDES(mu_);
  void SetFinish(Sequence& s, FinishReason r, std::string message = {});
  void ExpireDeadlines();

  // Ensures `s` holds blocks for `n_tokens` positions, evicting cached blocks if needed.
  bool Reserve(Sequence& s, int64_t n_tokens);

  // Ensures `s` can compute its next n positions: blocks for them, and (sliding layers) window
  // storage for the blocks they are written to.
  bool ReserveStep(Sequence& s, int n);

  // kv_.AttachWindow; when too little is free, first takes window storage back from blocks
  // only the prefix cache holds, then unpins the cache's windows and lets every running
  // sequence give back what it has moved past, before the caller preempts anyone.
  Status AttachWindow(std::span<const int32_t> table, int64_t first_pos, int64_t end_pos);

  // Gives back the window storage of the blocks `s` has moved past. The prefix cache's
  // references keep a window only where it is pinned.
  void TrimWindow(Sequence& s);
  void Admit();

  // Counts how a preempted sequence's computed tokens came back on its admission: the first
  // `from_cache` of its n_computed from the prefix cache, the rest of n_computed from the pool.
  void CountResumed(Sequence& s, int from_cache);

  // Admits the waiting sequences after the head that already hold blocks (KV pushed by a
  // prefill worker) and can get the rest now, in order.
  void AdmitHoldersBehind();
  bool UsesPool() const;

  // Whether reading a block from the KV pool costs less than computing it, as measured here:
  // the pool's wall time per block it gave (misses included) against the engine's prefill time
  // per block of tokens. Until kMinFetchedBlocks blocks came from the pool it fetches (nothing
  // measured yet); after deciding against it kFetchProbeEvery times in a row it fetches once
  // more, so that a pool that became faster is seen. Skips are counted.
  bool FetchPaysOff();

  // Reads what the KV pool holds of full blocks [from, keys.size()) into table[from, ...)
  // (fresh blocks after a local prefix of `from` blocks that can be resumed from; keys are the
  // table's from block 0) and returns the end of the prefix now held, `from` if none. With
  // sliding layers only an end whose window the pool holds counts (KvPool): those windows are
  // read into window storage attached here, and no block is read without one. What was read
  // joins the prefix cache, with the window behind its end pinned.
  int ReadFromPool(std::span<const uint64_t> keys, std::span<const int32_t> table, int from);
  // Reads the pool's windows of the fresh blocks among those a sequence resuming at block `end`
  // reads ([max(from, window start), end) of `table`) into window storage attached here; false
  // (and the storage given back) when there is no room or the pool no longer has them all.
  bool ReadWindows(std::span<const uint64_t> keys, std::span<const int32_t> table, int from,
                   int end);

  // For a sequence whose blocks hold its local prefix-cache hit (n_computed tokens) followed by
  // fresh blocks for the rest: ReadFromPool into those fresh blocks.
  void FetchFromPool(Sequence& s);

  // Offers the full blocks of a finished or preempted sequence that the pool may lack, and
  // (sliding layers) the windows behind its end.
  void OfferToPool(Sequence& s);

  // Frees the newest running sequence other than `keep` (and not finished) for recompute
  // later; false if none.
  bool PreemptOne(const Sequence* keep);
  // Frees running_[index] for later: its KV offered to the prefix cache and the pool, the
  // sequence first in the waiting queue.
  void Preempt(size_t index);
  // Whether KV blocks are held by anything but `s` that will give them back without `s`
  // finishing: reservations for pushed KV, waiting sequences that hold their KV, other running
  // sequences (finished ones until they are reaped).
  bool KvHeldByOthers(const Sequence& s) const;

  // Offers a sequence's computed full blocks to the prefix cache, pinning the window behind
  // their end (sliding-window models) so that the prefix can be resumed from there.
  void OfferBlocks(Sequence& s);
  // Pins, in the prefix cache, the windows of the blocks of `table` (position order) that a
  // sequence resuming at block `end` reads (sliding-window models; nothing otherwise).
  void PinWindowsBehind(std::span<const int32_t> table, int end);

  // Keys of the full blocks among the first n_tokens tokens of `s`, hashing only blocks not
  // hashed before.
  std::span<const uint64_t> KeysOf(Sequence& s, size_t n_tokens);
  void Step();
  static bool WantsPromptLogprobs(const Sequence& s);

  // Prompt logprobs: row j of an all_logits item (position start + j) scores the prompt token
  // at start + j + 1.
  void CollectPromptLogprobs(Sequence& s, const engine::BatchItem& item, const float* rows);

  // Adds a forward step's time to the busy counters, split by its tokens: a decode token is one
  // generated token fed back (one position past the prompt); anything else is prefill work.
  template <typename PlannedList>
  void CountBusy(const PlannedList& plan, Clock::duration took) {
    int64_t prefill = 0, decode = 0;
    for (const auto& p : plan) {
      if (p.n == 1 && p.seq->n_computed >= p.seq->n_prompt) {
        ++decode;
      } else {
        prefill += p.n;
      }
    }
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
    const int64_t prefill_us = prefill + decode > 0 ? us * prefill / (prefill + decode) : 0;
    busy_us_prefill_.fetch_add(prefill_us);
    busy_us_decode_.fetch_add(us - prefill_us);
    const int threads = engine_->threads();
    busy_core_us_prefill_.fetch_add(prefill_us * threads);
    busy_core_us_decode_.fetch_add((us - prefill_us) * threads);
    computed_prefill_.fetch_add(prefill);
    computed_decode_.fetch_add(decode);
  }

  // Finishes every sequence marked finished: frees its blocks and tells its sink.
  void ReapFinished();
  void PublishStats() TANDEM_EXCLUDES(mu_, keys_mu_);
  SchedulerOptions options_;
  engine::MemoryPlan memory_plan_;  // set at construction
  engine::PagedKvCache& kv_;
  const int block_tokens_;
  PrefixCache prefix_cache_;               // loop thread only
  const std::vector<int32_t> end_tokens_;  // the model's end-of-generation ids (min_tokens)
  mutable std::once_flag token_table_once_;
  mutable std::shared_ptr<const structured::TokenTable> token_table_;  // set once, then read-only
  std::shared_ptr<spdlog::logger> log_;
  std::vector<float> logits_;  // loop thread only

  // Loop thread only (no lock; RunOnLoop / PostToLoop run other threads' work there).
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  // Nothing runs and the waiting could not be admitted at the last turn (loop thread only; read
  // by the loop's own wait).
  bool admission_stalled_ = false;
  static constexpr std::chrono::milliseconds kStalledRetry{20};
  // The KV pool's measured cost (FetchPaysOff): wall nanoseconds of its fetches, the blocks
  // they gave, and decisions against it since the last fetch.
  int64_t fetch_ns_ = 0;
  int64_t fetched_blocks_ = 0;
  int skipped_in_a_row_ = 0;
  static constexpr int64_t kMinFetchedBlocks = 8;
  static constexpr int kFetchProbeEvery = 16;
  Mutex mu_;
  CondVar cv_;       // work arrived or stop/drain requested
  CondVar idle_cv_;  // the loop went idle
  std::vector<std::unique_ptr<Sequence>> inbox_ TANDEM_GUARDED_BY(mu_);
  std::vector<std::function<void()>> commands_ TANDEM_GUARDED_BY(mu_);  // run by the loop thread
  std::unordered_map<std::string, Reservation> reservations_;           // loop thread only
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  bool draining_ TANDEM_GUARDED_BY(mu_) = false;
  bool idle_ TANDEM_GUARDED_BY(mu_) = true;
  Clock::time_point drain_deadline_ TANDEM_GUARDED_BY(mu_) = Clock::time_point::max();

  // Published by the loop thread for Stats() and CheckAcceptingLocked(): lock-free.
  std::atomic<int> running_count_{0};
  std::atomic<int> waiting_count_{0};
  std::atomic<int> kv_used_{0};
  std::atomic<int> kv_cached_{0};
  std::atomic<int> kv_window_used_{0};
  std::atomic<int64_t> cache_hit_tokens_{0};
  std::atomic<int64_t> pool_hit_tokens_{0};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generated_tokens_{0};
  std::atomic<int64_t> preemptions_{0};
  std::atomic<int64_t> preempt_offloaded_{0}, preempt_resumed_cache_{0}, preempt_resumed_pool_{0},
      preempt_recomputed_{0};
  std::atomic<int64_t> pool_fetches_skipped_{0};  // FetchPaysOff said no
  std::atomic<int64_t> pool_window_misses_{0};    // ReadFromPool: windows not read
  std::atomic<int> reserved_blocks_{0};
  std::atomic<int64_t> reservations_expired_{0};
  std::atomic<int64_t> busy_us_prefill_{0};  // microseconds of forward passes (CountBusy)
  std::atomic<int64_t> busy_us_decode_{0};
  std::atomic<int> engine_threads_{0};  // the engine's thread count, for Stats() off the loop
  std::atomic<int64_t> busy_core_us_prefill_{0};  // the same times the threads of each pass
  std::atomic<int64_t> busy_core_us_decode_{0};
  std::atomic<int64_t> sampling_ns_{0};
  std::atomic<int64_t> computed_prefill_{0};
  std::atomic<int64_t> computed_decode_{0};
  mutable Mutex keys_mu_;
  std::vector<uint64_t> cached_keys_ TANDEM_GUARDED_BY(keys_mu_);  // the prefix cache's keys
  uint64_t published_keys_version_ = 0;  // loop thread only: the version cached_keys_ holds

  std::thread loop_;  // last: starts after every member above is constructed
};

}  // namespace tandem::serving::internal
