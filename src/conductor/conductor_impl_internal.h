// The conductor's implementation (conductor.h has the interface), split by concern:
//   conductor.cc             lifecycle, Submit, Stats, Drain, the worker list, role changes
//   conductor_placement.cc   the pool's answer, block keys, placement, waiting for a prefill turn
//   conductor_membership.cc  heartbeats, membership refresh, the planner and its hook
//   conductor_request.cc     one request: prefill (single or pipelined), decode, migration, finish
// Internal to src/conductor.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <thread>
#include <unordered_set>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "conductor/cluster_view.h"
#include "conductor/conductor.h"
#include "conductor/metrics.h"
#include "conductor/pipelined_prefill.h"
#include "conductor/worker_client.h"
#include "serving/block_keys.h"
#include "store/pool.h"

namespace tandem::conductor::internal {

using cluster::DecodeCall;
using cluster::DecodeEvent;
using cluster::KvTarget;
using cluster::PrefillCall;
using cluster::PrefillResult;
using cluster::Role;
using cluster::WorkerInfo;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline int64_t MillisUntil(Clock::time_point t) {
  if (t == Clock::time_point::max()) return 3600 * 1000;
  return std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count());
}

// One request from Submit to OnFinish. Owned by its thread.
struct RequestRun {
  serving::GenerationRequest r;
  std::shared_ptr<serving::GenerationSink> sink;
  RequestLoad load;
  double slo_ttft_s = 0, slo_tbt_s = 0;
  Placement placement;
  std::string decode, prefill;       // names; prefill empty: local
  Clock::time_point committed_at{};  // when the current placement was made
  bool waited_for_kv = false;

  // Progress of the current attempt.
  bool fall_back_local = false;  // stop this stream and run the request locally
  bool retry_kv = false;         // the decode worker had no room: wait and place again
  bool cancelled = false;        // the client went away
  int tokens = 0;                // tokens given to the sink
  std::vector<int32_t> output;   // their ids (a migrated stream resumes from them)
  int migrations = 0;            // times the stream moved to another decode worker
  std::optional<serving::FinishInfo> finish;
  Status error;
  std::optional<PrefillResult> prefill_result;
  bool pipelined = false;  // prefill_result came from a pipeline of prefill workers
  Clock::time_point first_token_at{};
  double predicted_ttft_s = 0, predicted_tbt_s = 0;  // of the placement that produced tokens
};

// The prefill call of `run` into `target` (for one worker; a pipeline sets each stage's part).
inline PrefillCall PrefillCallFor(const RequestRun& run, const KvTarget& target) {
  PrefillCall call;
  call.id = run.r.id;
  call.prompt_tokens = run.r.prompt_tokens;
  call.sampling = run.r.sampling;
  call.timeout_ms = MillisUntil(run.r.deadline);
  call.target = target;
  return call;
}

class ConductorImpl final : public Conductor {
 public:
  explicit ConductorImpl(ConductorOptions o);
  ~ConductorImpl() override;
  Status Submit(serving::GenerationRequest request,
                std::shared_ptr<serving::GenerationSink> sink) override TANDEM_EXCLUDES(mu_);
  int RetryAfterSeconds() const override;
  serving::BackendStats Stats() const override TANDEM_EXCLUDES(mu_);
  void Drain(Clock::time_point deadline) override TANDEM_EXCLUDES(mu_);
  Status WaitForWorkers(int prefill, int decode, Clock::time_point deadline) override
      TANDEM_EXCLUDES(mu_);
  std::vector<WorkerView> Workers() const override TANDEM_EXCLUDES(mu_);
  void CountWorkerRestart(Role) override { metrics_.restarts.fetch_add(1); }

  Status ChangeRole(const std::string& worker, Role role, const std::string& reason) override
      TANDEM_EXCLUDES(mu_);
  Status ChangeThreads(const std::string& worker, int threads, const std::string& reason) override
      TANDEM_EXCLUDES(mu_);
  int ReserveCores(int wanted, Clock::duration hold) override TANDEM_EXCLUDES(mu_);

 private:
  // ---- placement ----

  // Sets run->load.pool_prompt_tokens: prompt tokens (whole blocks, leaving one to compute) whose
  // KV the cluster pool holds, asked of its master; 0 without a pool, a master or an answer in
  // time (counted). The prompt's block keys it hashes stay in run->load (KeysFor keeps them).
  void AskPool(RequestRun* run) TANDEM_EXCLUDES(mu_);
  // Sliding-window models (window tokens > 0): of the first `held` blocks the pool holds, the
  // prefix a worker would read, which ends where the pool holds the windows behind its end.
  StatusOr<int> ResumableInPool(const std::vector<uint64_t>& keys, int held, const std::string& ns,
                                int bt, int window);

  // The prompt's block keys for the workers' block size (all workers of a cluster agree).
  void KeysFor(RequestRun* run) TANDEM_REQUIRES(mu_);
  RequestShape ShapeOf(const RequestRun& run) const TANDEM_REQUIRES(mu_);
  int ExpectedOutputLocked() const TANDEM_REQUIRES(mu_);

  // Places `run` on the current view; *decode and *prefill get the chosen workers' names
  // (prefill empty when local or none).
  Placement PlaceLocked(const RequestRun& run, AdmissionPolicy admission,
                        std::span<const std::string> exclude_prefill, std::string* decode,
                        std::string* prefill) TANDEM_REQUIRES(mu_);

  // Counts a request in waiting_for_kv_ (and once in tandem_kv_wait_requests_total) from
  // Start() until it goes out of scope. Declared after the lock on mu_ it needs, so that it is
  // released before it. (The analysis cannot tie c_->mu_ to the caller's lock on mu_, hence
  // the AssertHeld calls.)
  class KvWait {
   public:
    KvWait(ConductorImpl* c, RequestRun* run) : c_(c), run_(run) {}
    ~KvWait() {
      c_->mu_.AssertHeld();
      if (counted_) --c_->waiting_for_kv_;
    }
    void Start() {
      c_->mu_.AssertHeld();
      if (counted_) return;
      counted_ = true;
      ++c_->waiting_for_kv_;
      if (!run_->waited_for_kv) c_->metrics_.kv_waits.fetch_add(1);
      run_->waited_for_kv = true;
    }
    bool counted() const { return counted_; }

   private:
    ConductorImpl* c_;
    RequestRun* run_;
    bool counted_ = false;
  };

  // Places (or re-places) the request for its thread, waiting while no decode worker has KV
  // room; `force_local`: the decode worker computes the prompt. False when it cannot run
  // (run->error says why). An admitted request is not rejected later (kNone never rejects).
  // `resume` (a stream moving off a failed decode worker): a fresh placement, computed locally,
  // that also waits while no decode worker is up (the supervisor restarts a dead one).
  bool PlaceForRun(RequestRun* run, bool first, bool force_local, bool resume) TANDEM_EXCLUDES(mu_);

  // Holds a request placed on a prefill worker until little predicted work is ahead of it
  // there, so that its decode reservation does not hold KV blocks idle through the prefill
  // queue; with kCacheLoad it is placed again meanwhile (the best worker, or local prefill, may
  // change as the queues move). False when the request cannot run (run->error says why).
  // Then promises the blocks its reservation takes on the decode worker, waiting for room.
  bool WaitForPrefillTurn(RequestRun* run, bool may_replace) TANDEM_EXCLUDES(mu_);

  // ---- membership ----

  void HeartbeatLoop() TANDEM_EXCLUDES(mu_);

  // ---- elastic pools ----

  // One decision of the planner on the current view, carried out (heartbeat thread).
  void PlanPools() TANDEM_EXCLUDES(mu_);

  // One plan of the thread planner on the current view with these pool loads, carried out:
  // shrinks first, then growths, so the budget holds at every moment (heartbeat thread).
  void PlanCores(double prefill_load, double decode_load) TANDEM_EXCLUDES(mu_);
  // The thread planner's input from the view (loads left 0), reserved cores included.
  ThreadPlanInput CoresInputLocked(std::vector<std::string>* names) TANDEM_REQUIRES(mu_);
  // Carries out `plan` (its changes to `names`), shrinks first.
  void ApplyThreadPlan(const ThreadPlan& plan, const ThreadPlanInput& in,
                       const std::vector<std::string>& names, bool shrinks_only)
      TANDEM_EXCLUDES(mu_);

  // Runs --planner-hook for a scale request (at most once per dwell time), without waiting:
  // a thread reaps it and counts its outcome.
  void RunPlannerHook(const PlannerDecision& d, const std::string& worker) TANDEM_EXCLUDES(mu_);

  // Counts the hook runs that ended (planner thread; never waits).
  void ReapPlannerHooks();
  void JoinFinishedThreads() TANDEM_EXCLUDES(mu_);
  void RefreshMembership() TANDEM_EXCLUDES(refresh_mu_, mu_);

  // Marks a worker unhealthy at once (a broken connection), until its next good heartbeat.
  void Suspect(const std::string& name) TANDEM_EXCLUDES(mu_);
  std::shared_ptr<WorkerClient> ClientOf(const std::string& name) TANDEM_EXCLUDES(mu_);

  // ---- one request ----

  // Runs the prefill of a reserved request, trying prefill workers until one succeeds.
  // Returns false when none could (the caller falls back to local).
  bool Prefill(RequestRun* run, const KvTarget& target) TANDEM_EXCLUDES(mu_);

  // The prefill workers of a pipeline for `run` (ChoosePipelineGroup); fewer than two when it is
  // not to be pipelined (WantsPipeline).
  std::vector<StageWorker> PipelineGroup(const RequestRun& run, const KvTarget& target)
      TANDEM_EXCLUDES(mu_);

  // Prefills `run` on a pipeline of prefill workers when it qualifies (PipelineGroup); false
  // when it does not or the pipeline failed (one worker prefills it then).
  bool PrefillPipelined(RequestRun* run, const KvTarget& target) TANDEM_EXCLUDES(mu_);
  void Run(std::unique_ptr<RequestRun> run) TANDEM_EXCLUDES(mu_);

  // Whether a stream that broke may continue on another decode worker: the worker failed (not
  // the request's own deadline or input), time and output are left, and it has not moved too
  // often already.
  bool MayMigrate(const RequestRun& run) const;
  void Finish(RequestRun* run, bool fell_back) TANDEM_EXCLUDES(mu_);

  // One /v1/decode stream.
  void RunOnDecode(RequestRun* run, bool local) TANDEM_EXCLUDES(mu_);
  ConductorOptions options_;
  std::shared_ptr<spdlog::logger> log_;

  // Held by one RefreshMembership at a time (it guards no member). Lock order: refresh_mu_
  // before mu_.
  Mutex refresh_mu_;
  mutable Mutex mu_;
  CondVar cv_;
  Clock::time_point last_refresh_ TANDEM_GUARDED_BY(mu_) = {};  // last membership refresh
  ClusterView view_ TANDEM_GUARDED_BY(mu_);
  std::vector<std::string> names_scratch_ TANDEM_GUARDED_BY(mu_);
  std::mt19937_64 rng_ TANDEM_GUARDED_BY(mu_);
  uint64_t next_seq_ TANDEM_GUARDED_BY(mu_) = 0;
  double expected_output_ TANDEM_GUARDED_BY(mu_) = 64;  // moving average of outputs
  int active_ TANDEM_GUARDED_BY(mu_) = 0;               // request threads running
  int waiting_for_kv_ TANDEM_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> threads_ TANDEM_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_threads_ TANDEM_GUARDED_BY(mu_);  // ended, to be joined
  bool draining_ TANDEM_GUARDED_BY(mu_) = false;
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancel_all_{false};
  std::atomic<uint64_t> pipeline_attempts_{0};  // names each pipeline's session
  std::atomic<double> retry_after_s_{1.0};
  ConductorMetrics metrics_;                              // thread-safe
  std::unique_ptr<store::PoolDirectory> pool_directory_;  // set at construction; thread-safe
  Clock::time_point last_role_change_ TANDEM_GUARDED_BY(mu_) = {};  // any worker's, by us
  Clock::time_point last_hook_ TANDEM_GUARDED_BY(mu_) = {};         // --planner-hook's last run
  std::vector<std::pair<pid_t, std::string>> hooks_running_;  // planner thread only: pid, request
  // Requests that arrived since the planner's last decision, and those refused for an SLO.
  int64_t arrivals_since_plan_ TANDEM_GUARDED_BY(mu_) = 0;
  int64_t ttft_rejected_since_plan_ TANDEM_GUARDED_BY(mu_) = 0;
  int64_t tbt_rejected_since_plan_ TANDEM_GUARDED_BY(mu_) = 0;
  Clock::time_point next_plan_ = {};  // heartbeat thread only
  // Cores held for workers being started (ReserveCores): each until a worker joins after it
  // was made, or until its deadline.
  struct CoreReservation {
    int cores = 0;
    Clock::time_point made, until;
  };
  std::vector<CoreReservation> reservations_ TANDEM_GUARDED_BY(mu_);
  Mutex threads_mu_;  // serialises thread plans (heartbeat thread and ReserveCores callers)

  std::thread heartbeat_;  // last: starts after the members above exist
};

}  // namespace tandem::conductor::internal
