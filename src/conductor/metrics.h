// The conductor's own figures for /metrics: placement outcomes (rejections by reason, local
// prefills, waits for KV room), SLO attainment, prefill work by the request's outcome (work
// spent on requests that then missed their SLO is "wasted"), and how good its predictions are
// (|predicted - measured| / measured of TTFT and of time between tokens).
//
// Thread-safety: thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "common/mutex.h"
#include "conductor/cluster_view.h"
#include "serving/backend.h"

namespace tandem::conductor {

class ConductorMetrics {
 public:
  ConductorMetrics();

  // Per-worker gauges, gathered under the conductor's lock.
  struct WorkerTotals {
    struct One {
      std::string name, role;
      bool healthy = false;
      int inflight = 0;
      double queue_s = 0;
      double decode_step_s = 0;  // predicted for its current batch (0: no model or empty)
      int decoding = 0;
      // Its engine's utilisation counters at its last /stats (serving::BackendStats).
      double busy_prefill_s = 0, busy_decode_s = 0;
      double busy_core_prefill_s = 0, busy_core_decode_s = 0;
      bool listed = true;  // in the metadata service's last listing
      int64_t tokens_prefill = 0, tokens_decode = 0;
      int threads = 0;
      double sampling_s = 0;                         // cumulative seconds drawing tokens
      int running = 0;                               // sequences its engine runs now
      int kv_total = 0, kv_used = 0, kv_cached = 0;  // its KV blocks
      serving::BackendStats memory;  // its memory plan, budget and resident set only
    };
    std::vector<One> workers;
    // Sums over live workers.
    uint64_t transfer_failures = 0, transfer_timeouts = 0, kv_wait_timeouts = 0, kv_bytes = 0;
    uint64_t auth_refusals = 0;                          // the workers' (live ones)
    std::map<std::string, store::PoolClientStats> pool;  // by role, over live workers using it
    void Add(const ClusterView::Worker& w, const std::string& name, Clock::time_point now);
  };

  void Reject(const std::string& reason) TANDEM_EXCLUDES(mu_);
  void CountSlo(bool met) TANDEM_EXCLUDES(mu_);
  void PrefillTokens(const std::string& outcome, int64_t tokens) TANDEM_EXCLUDES(mu_);
  // Seconds; a measured value <= 0 or a prediction <= 0 is not observed.
  void ObservePrediction(double predicted_ttft, double measured_ttft, double predicted_tbt,
                         double measured_tbt);
  void Export(const WorkerTotals& totals, serving::BackendStats* out) const TANDEM_EXCLUDES(mu_);
  // Elastic pools: a planner decision (action "none" included, by reason) and the pool sizes
  // it aims at; a role switch carried out.
  void PlannerDecided(const std::string& action, const std::string& reason, int target_prefill,
                      int target_decode) TANDEM_EXCLUDES(mu_);
  void RoleSwitched(const std::string& from, const std::string& to) TANDEM_EXCLUDES(mu_);
  // The orchestrator hook was run for `request` (add_prefill, add_decode, remove) and ended
  // with `outcome` (ok, failed).
  void HookCalled(const std::string& request, const std::string& outcome) TANDEM_EXCLUDES(mu_);
  // A worker's engine threads were changed (PlanThreads' reason, or "asked") from `from` to
  // `to`; `budget` is the host's core budget (0: none).
  void ThreadsChanged(const std::string& reason, int from, int to) TANDEM_EXCLUDES(mu_);
  void CoreBudget(int cores, int reserved) TANDEM_EXCLUDES(mu_);

  std::atomic<int64_t> disaggregated{0};
  std::atomic<int64_t> fallbacks{0};
  std::atomic<int64_t> local_prefills{0};
  std::atomic<int64_t> kv_waits{0};
  std::atomic<int64_t> pool_lookups{0};           // placements that asked the KV pool's master
  std::atomic<int64_t> pool_lookup_failures{0};   // ... and got no answer in time
  std::atomic<int64_t> pool_predicted_tokens{0};  // prompt tokens it said the pool holds
  std::atomic<int64_t> prefill_retries{0};
  // Pipelined prefills (policy/pipeline.h): completed, and failed (then prefilled whole).
  std::atomic<int64_t> pipelined_prefills{0};
  std::atomic<int64_t> pipelined_failures{0};
  std::atomic<int64_t> pipeline_stage_bytes{0};  // residual stream moved between stages
  std::atomic<int64_t> migrations{0};            // streams continued on another decode worker
  std::atomic<int64_t> failed_migrations{0};     // ... that could not be
  std::atomic<int64_t> worker_failures{0};
  std::atomic<int64_t> restarts{0};

 private:
  mutable Mutex mu_;
  std::map<std::string, int64_t> rejections_ TANDEM_GUARDED_BY(mu_);
  std::map<std::string, int64_t> prefill_tokens_ TANDEM_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> planner_decisions_ TANDEM_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> role_switches_ TANDEM_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> hook_calls_ TANDEM_GUARDED_BY(mu_);
  // (reason, grow | shrink) -> workers resized
  std::map<std::pair<std::string, std::string>, int64_t> thread_changes_ TANDEM_GUARDED_BY(mu_);
  int core_budget_ TANDEM_GUARDED_BY(mu_) = 0;  // 0: no thread planning
  int cores_reserved_ TANDEM_GUARDED_BY(mu_) = 0;
  int target_prefill_ TANDEM_GUARDED_BY(mu_) = -1;  // -1: no planner decision yet
  int target_decode_ TANDEM_GUARDED_BY(mu_) = -1;
  int64_t slo_met_ TANDEM_GUARDED_BY(mu_) = 0;
  int64_t slo_missed_ TANDEM_GUARDED_BY(mu_) = 0;
  Histogram predicted_ttft_, measured_ttft_, ttft_error_, tbt_error_;  // each has its own lock
};

}  // namespace tandem::conductor
