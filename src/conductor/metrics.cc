#include "conductor/metrics.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "common/cluster_auth.h"
#include "conductor/policy/placement.h"

namespace tandem::conductor {
namespace {

std::vector<double> SecondsBuckets() {
  return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60};
}
std::vector<double> ErrorBuckets() {
  return {0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5};
}

}  // namespace

ConductorMetrics::ConductorMetrics()
    : predicted_ttft_(SecondsBuckets()),
      measured_ttft_(SecondsBuckets()),
      ttft_error_(ErrorBuckets()),
      tbt_error_(ErrorBuckets()) {}

void ConductorMetrics::WorkerTotals::Add(const ClusterView::Worker& w, const std::string& name,
                                         Clock::time_point now) {
  One o;
  o.name = name;
  o.role = cluster::RoleName(w.info.role);
  o.healthy = w.healthy;
  o.inflight = static_cast<int>(w.placed.size());
  o.queue_s = ClusterView::QueueSeconds(w, now);
  o.decode_step_s = ClusterView::DecodeStepSeconds(w, &o.decoding);
  o.busy_prefill_s = w.stats.backend.busy_seconds_prefill;
  o.busy_decode_s = w.stats.backend.busy_seconds_decode;
  o.busy_core_prefill_s = w.stats.backend.busy_core_seconds_prefill;
  o.busy_core_decode_s = w.stats.backend.busy_core_seconds_decode;
  o.tokens_prefill = w.stats.backend.computed_tokens_prefill;
  o.tokens_decode = w.stats.backend.computed_tokens_decode;
  o.threads = w.stats.backend.engine_threads;
  o.listed = w.listed;
  o.sampling_s = w.stats.backend.sampling_seconds;
  o.running = w.stats.backend.running;
  o.kv_total = w.stats.backend.kv_blocks_total;
  o.kv_used = w.stats.backend.kv_blocks_used;
  o.kv_cached = w.stats.backend.kv_blocks_cached;
  o.memory.memory_plan = w.stats.backend.memory_plan;
  o.memory.memory_budget_bytes = w.stats.backend.memory_budget_bytes;
  o.memory.resident_bytes = w.stats.backend.resident_bytes;
  o.memory.peak_resident_bytes = w.stats.backend.peak_resident_bytes;
  workers.push_back(o);
  if (w.healthy) {
    transfer_failures += w.stats.transfer_failures;
    transfer_timeouts += w.stats.transfer_timeouts;
    kv_wait_timeouts += w.stats.kv_wait_timeouts;
    auth_refusals += w.stats.auth_refusals;
    kv_bytes += w.stats.kv_bytes_pushed;
    if (w.stats.pool_enabled) pool[o.role] += w.stats.pool;
  }
}

void ConductorMetrics::Reject(const std::string& reason) {
  MutexLock lock(&mu_);
  rejections_[reason]++;
}

void ConductorMetrics::CountSlo(bool met) {
  MutexLock lock(&mu_);
  (met ? slo_met_ : slo_missed_)++;
}

void ConductorMetrics::PrefillTokens(const std::string& outcome, int64_t tokens) {
  MutexLock lock(&mu_);
  prefill_tokens_[outcome] += tokens;
}

void ConductorMetrics::PlannerDecided(const std::string& action, const std::string& reason,
                                      int target_prefill, int target_decode) {
  MutexLock lock(&mu_);
  planner_decisions_[{action, reason}]++;
  target_prefill_ = target_prefill;
  target_decode_ = target_decode;
}

void ConductorMetrics::RoleSwitched(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  role_switches_[{from, to}]++;
}

void ConductorMetrics::HookCalled(const std::string& request, const std::string& outcome) {
  MutexLock lock(&mu_);
  hook_calls_[{request, outcome}]++;
}

void ConductorMetrics::ThreadsChanged(const std::string& reason, int from, int to) {
  MutexLock lock(&mu_);
  thread_changes_[{reason, to > from ? "grow" : "shrink"}]++;
}

void ConductorMetrics::CoreBudget(int cores, int reserved) {
  MutexLock lock(&mu_);
  core_budget_ = cores;
  cores_reserved_ = reserved;
}

void ConductorMetrics::ObservePrediction(double predicted_ttft, double measured_ttft,
                                         double predicted_tbt, double measured_tbt) {
  if (predicted_ttft > 0 && measured_ttft > 0) {
    predicted_ttft_.Observe(predicted_ttft);
    measured_ttft_.Observe(measured_ttft);
    ttft_error_.Observe(std::fabs(predicted_ttft - measured_ttft) / measured_ttft);
  }
  if (predicted_tbt > 0 && measured_tbt > 0) {
    tbt_error_.Observe(std::fabs(predicted_tbt - measured_tbt) / measured_tbt);
  }
}

void ConductorMetrics::Export(const WorkerTotals& totals, serving::BackendStats* s) const {
  std::map<std::string, std::pair<int, int>> by_role;  // role -> (healthy, all)
  for (const auto& w : totals.workers) {
    auto& r = by_role[w.role];
    r.second++;
    if (w.healthy) r.first++;
  }
  for (const char* role : {"prefill", "decode", "mixed"}) {
    const auto it = by_role.find(role);
    const auto counts = it == by_role.end() ? std::make_pair(0, 0) : it->second;
    s->extra.push_back({"tandem_workers",
                        "Workers known to the conductor, by role and state.",
                        false,
                        {{"role", role}, {"state", "healthy"}},
                        double(counts.first)});
    s->extra.push_back({"tandem_workers",
                        "",
                        false,
                        {{"role", role}, {"state", "unhealthy"}},
                        double(counts.second - counts.first)});
  }
  for (const auto& w : totals.workers) {
    s->extra.push_back({"tandem_worker_inflight_requests",
                        "Requests the conductor has placed on each worker and not seen end "
                        "(prefill workers: until the prefill is done).",
                        false,
                        {{"worker", w.name}},
                        double(w.inflight)});
    s->extra.push_back({"tandem_worker_predicted_queue_seconds",
                        "Predicted prefill work placed on each worker and not yet done.",
                        false,
                        {{"worker", w.name}},
                        w.queue_s});
    s->extra.push_back({"tandem_worker_predicted_decode_step_seconds",
                        "Predicted decode step time of each worker's current batch (cost model).",
                        false,
                        {{"worker", w.name}},
                        w.decode_step_s});
  }
  for (const auto& w : totals.workers) {
    if (w.threads <= 0) continue;  // no /stats yet
    for (const auto& [phase, busy, core_s, tokens] :
         {std::tuple{"prefill", w.busy_prefill_s, w.busy_core_prefill_s, w.tokens_prefill},
          std::tuple{"decode", w.busy_decode_s, w.busy_core_decode_s, w.tokens_decode}}) {
      s->extra.push_back({"tandem_worker_busy_core_seconds_total",
                          serving::kBusyCoreSecondsHelp,
                          true,
                          {{"worker", w.name}, {"role", w.role}, {"phase", phase}},
                          core_s});
      s->extra.push_back({"tandem_worker_busy_seconds_total",
                          serving::kBusySecondsHelp,
                          true,
                          {{"worker", w.name}, {"role", w.role}, {"phase", phase}},
                          busy});
      s->extra.push_back({"tandem_worker_computed_tokens_total",
                          serving::kComputedTokensHelp,
                          true,
                          {{"worker", w.name}, {"role", w.role}, {"phase", phase}},
                          double(tokens)});
    }
    s->extra.push_back({"tandem_worker_threads",
                        serving::kThreadsHelp,
                        false,
                        {{"worker", w.name}, {"role", w.role}},
                        // A worker that left the metadata service (stopped) computes on none.
                        double(w.listed ? w.threads : 0)});
    s->extra.push_back({"tandem_worker_sampling_seconds_total",
                        serving::kSamplingSecondsHelp,
                        true,
                        {{"worker", w.name}, {"role", w.role}},
                        w.sampling_s});
    s->extra.push_back({"tandem_worker_running_sequences",
                        "Sequences each worker's engine runs (at its last /stats).",
                        false,
                        {{"worker", w.name}, {"role", w.role}},
                        double(w.running)});
    for (const auto& [state, blocks] :
         {std::pair{"used", w.kv_used}, std::pair{"cached", w.kv_cached},
          std::pair{"free", w.kv_total - w.kv_used - w.kv_cached}}) {
      s->extra.push_back({"tandem_worker_kv_blocks",
                          "KV-cache blocks of each worker by state: used by sequences, cached "
                          "(prefix cache only), free.",
                          false,
                          {{"worker", w.name}, {"role", w.role}, {"state", state}},
                          double(blocks)});
    }
    serving::AppendMemoryMetrics(w.memory, {{"worker", w.name}, {"role", w.role}}, &s->extra);
  }
  auto counter = [&](const char* name, const char* help, double v) {
    s->extra.push_back({name, help, true, {}, v});
  };
  counter("tandem_disaggregated_requests_total",
          "Requests whose prompt was computed on a prefill worker and KV moved to a decode worker.",
          double(disaggregated.load()));
  counter("tandem_colocated_fallback_requests_total",
          "Requests computed on their decode worker because every prefill attempt failed.",
          double(fallbacks.load()));
  counter("tandem_local_prefill_requests_total",
          "Requests whose prompt the conductor chose to compute on the decode worker (conditional "
          "disaggregation: cheaper than prefill queue + transfer, within the TBT SLO).",
          double(local_prefills.load()));
  counter("tandem_conductor_pool_lookups_total",
          "Placements that asked the KV pool's master how much of the prompt it holds.",
          double(pool_lookups.load()));
  counter("tandem_conductor_pool_lookup_failures_total",
          "KV pool lookups of the conductor that got no answer in time (placed as if empty).",
          double(pool_lookup_failures.load()));
  counter("tandem_conductor_pool_predicted_tokens_total",
          "Prompt tokens the KV pool held when their requests were placed (a prefill worker "
          "using the pool is predicted to fetch them, not compute them).",
          double(pool_predicted_tokens.load()));
  counter("tandem_kv_wait_requests_total",
          "Admitted requests that waited because no decode worker had room for their KV.",
          double(kv_waits.load()));
  counter("tandem_prefill_retries_total",
          "Prefill attempts that failed and were retried elsewhere.",
          double(prefill_retries.load()));
  counter("tandem_pipelined_prefills_total",
          "Prompts prefilled by a pipeline of prefill workers (chunked pipeline parallelism: each "
          "worker a range of layers, chunks flowing through them).",
          double(pipelined_prefills.load()));
  counter("tandem_pipelined_prefill_failures_total",
          "Pipelined prefills that failed on some stage and were prefilled on one worker instead.",
          double(pipelined_failures.load()));
  counter("tandem_pipeline_stage_bytes_total",
          "Bytes of residual stream the stages of pipelined prefills passed to each other.",
          double(pipeline_stage_bytes.load()));
  counter("tandem_stream_migrations_total",
          "Streams whose decode worker failed mid-way, continued on another decode worker (or "
          "the restarted one) from the tokens already sent: the client saw one stream.",
          double(migrations.load()));
  counter("tandem_stream_migrations_failed_total",
          "Streams whose decode worker failed mid-way and that no decode worker could continue "
          "before the deadline (the client got an error).",
          double(failed_migrations.load()));
  counter("tandem_worker_failures_total",
          "Requests that failed because a worker's connection broke or it answered an error.",
          double(worker_failures.load()));
  counter("tandem_worker_restarts_total", "Worker processes restarted by the supervisor.",
          double(restarts.load()));
  counter("tandem_kv_transfer_failures_total",
          "KV pushes that failed (sum over live prefill workers).",
          double(totals.transfer_failures));
  counter("tandem_kv_transfer_timeouts_total",
          "KV pushes that timed out (sum over live prefill workers).",
          double(totals.transfer_timeouts));
  counter("tandem_kv_wait_timeouts_total",
          "Decode reservations whose KV never arrived (sum over live decode workers).",
          double(totals.kv_wait_timeouts));
  counter("tandem_kv_transfer_bytes_total", "KV bytes pushed from prefill to decode workers.",
          double(totals.kv_bytes));
  counter("tandem_cluster_auth_refusals_total",
          "Peers refused for want of the cluster token: by this process (its metadata service, "
          "answers to its calls) and by the live workers (control calls, KV connections).",
          double(ClusterAuthRefusals() + totals.auth_refusals));
  // The cluster KV pool, as its clients (the workers) see it, by role.
  for (const auto& entry : totals.pool) {
    const std::string& role = entry.first;  // (clang 14 cannot capture a structured binding)
    const store::PoolClientStats& p = entry.second;
    auto pool = [&](const char* name, const char* help, bool is_counter, double v,
                    std::vector<std::pair<std::string, std::string>> labels = {}) {
      labels.insert(labels.begin(), {"role", role});
      s->extra.push_back({name, help, is_counter, std::move(labels), v});
    };
    pool("tandem_kv_pool_lookups_total",
         "Prompts whose uncached part was looked up in the KV pool.", true, double(p.get_calls));
    pool("tandem_kv_pool_miss_lookups_total", "KV pool lookups that found nothing.", true,
         double(p.miss_calls));
    pool("tandem_kv_pool_hit_blocks_total", "KV blocks read from the KV pool instead of computed.",
         true, double(p.hit_objects));
    pool("tandem_kv_pool_fetched_bytes_total", "Bytes read from the KV pool.", true,
         double(p.bytes_fetched));
    pool("tandem_kv_pool_fetch_seconds_total", "Wall time spent reading KV blocks from the pool.",
         true, p.fetch_seconds);
    pool("tandem_kv_pool_fetch_failures_total",
         "KV blocks the pool listed but that could not be read (the prompt computed them).", true,
         double(p.fetch_failures));
    const char* put_help = "KV blocks offered to the pool, by outcome.";
    pool("tandem_kv_pool_put_blocks_total", put_help, true, double(p.put_objects),
         {{"outcome", "stored"}});
    pool("tandem_kv_pool_put_blocks_total", put_help, true, double(p.put_existing),
         {{"outcome", "existing"}});
    pool("tandem_kv_pool_put_blocks_total", put_help, true, double(p.put_no_space),
         {{"outcome", "no_space"}});
    pool("tandem_kv_pool_put_blocks_total", put_help, true, double(p.put_failures),
         {{"outcome", "failed"}});
    pool("tandem_kv_pool_master_unavailable_total",
         "KV pool calls that found no master (the worker used its local cache only).", true,
         double(p.master_unavailable));
    pool("tandem_kv_pool_dram_bytes", "Shared memory the workers contribute to the KV pool.", false,
         double(p.dram_bytes));
    pool("tandem_kv_pool_checksum_failures_total",
         "KV pool replicas read whose bytes did not match their checksum (not used; a miss).", true,
         double(p.checksum_failures));
    pool("tandem_kv_pool_hot_copies_total",
         "Extra replicas of hot KV blocks that the workers copied at the master's request.", true,
         double(p.hot_copies));
    pool("tandem_kv_pool_ssd_capacity_bytes", "Capacity of the workers' KV pool SSD tiers.", false,
         double(p.ssd_capacity_bytes));
    pool("tandem_kv_pool_ssd_used_bytes", "Bytes of the workers' KV pool SSD tiers in use.", false,
         double(p.ssd_used_bytes));
    pool("tandem_kv_pool_ssd_hit_blocks_total",
         "KV blocks read from a worker's SSD tier instead of computed.", true,
         double(p.ssd_hit_objects));
    const char* ssd_help = "KV blocks offered to the SSD tier, by outcome.";
    pool("tandem_kv_pool_ssd_writes_total", ssd_help, true, double(p.ssd_written_objects),
         {{"outcome", "written"}});
    pool("tandem_kv_pool_ssd_writes_total", ssd_help, true, double(p.ssd_dropped_objects),
         {{"outcome", "dropped"}});
    pool("tandem_kv_pool_ssd_corrupt_blocks_total",
         "SSD tier files that failed their checks on read (deleted; a miss, never used).", true,
         double(p.ssd_corrupt_objects));
    pool("tandem_kv_pool_ssd_evictions_total", "SSD tier files deleted to stay within capacity.",
         true, double(p.ssd_evictions));
  }
  {
    MutexLock lock(&mu_);
    int64_t all = 0;
    for (const char* reason : {"ttft_slo", "tbt_slo", "no_decode_worker", "inflight_limit"}) {
      const auto it = rejections_.find(reason);
      const int64_t n = it == rejections_.end() ? 0 : it->second;
      all += n;
      s->extra.push_back({"tandem_rejections_total",
                          "Requests refused at admission, by reason (ttft_slo / tbt_slo: the "
                          "predicted TTFT / TBT broke the SLO, before any work was spent).",
                          true,
                          {{"reason", reason}},
                          double(n)});
    }
    counter("tandem_placement_rejections_total",
            "Requests refused at admission (all reasons; see tandem_rejections_total).",
            double(all));
    for (const char* outcome : {"slo_met", "slo_missed", "failed"}) {
      const auto it = prefill_tokens_.find(outcome);
      s->extra.push_back({"tandem_prefill_tokens_total",
                          "Prompt tokens computed (not cached), by the request's outcome: slo_met "
                          "(or no SLO), slo_missed (wasted work), failed.",
                          true,
                          {{"outcome", outcome}},
                          double(it == prefill_tokens_.end() ? 0 : it->second)});
    }
    for (const auto& [key, n] : planner_decisions_) {
      s->extra.push_back({"tandem_planner_decisions_total",
                          "Decisions of the elastic-pools planner, by action (none, to_prefill, "
                          "to_decode) and reason.",
                          true,
                          {{"action", key.first}, {"reason", key.second}},
                          double(n)});
    }
    for (const auto& [key, n] : hook_calls_) {
      s->extra.push_back(
          {"tandem_planner_hook_calls_total",
           "Runs of the orchestrator hook (--planner-hook), by request (add_prefill, "
           "add_decode, remove) and outcome (ok: exit status 0, failed).",
           true,
           {{"request", key.first}, {"outcome", key.second}},
           double(n)});
    }
    for (const auto& [key, n] : thread_changes_) {
      s->extra.push_back({"tandem_thread_changes_total",
                          "Workers whose engine threads were changed at runtime, by reason (the "
                          "thread planner's: over_budget, spare_cores, prefill_load, decode_load; "
                          "or asked) and direction (grow, shrink).",
                          true,
                          {{"reason", key.first}, {"direction", key.second}},
                          double(n)});
    }
    if (core_budget_ > 0) {
      s->extra.push_back({"tandem_planner_core_budget",
                          "Cores the thread planner divides between the workers of this host.",
                          false,
                          {},
                          double(core_budget_)});
      s->extra.push_back({"tandem_planner_cores_reserved",
                          "Of the core budget, cores held for workers being started.",
                          false,
                          {},
                          double(cores_reserved_)});
    }
    for (const auto& [key, n] : role_switches_) {
      s->extra.push_back({"tandem_role_switches_total",
                          "Workers switched between roles at runtime.",
                          true,
                          {{"from", key.first}, {"to", key.second}},
                          double(n)});
    }
    if (target_prefill_ >= 0) {
      for (const auto& [role, n] :
           {std::pair{"prefill", target_prefill_}, std::pair{"decode", target_decode_}}) {
        s->extra.push_back({"tandem_planner_target_workers",
                            "Pool sizes the elastic-pools planner aims at (decode: "
                            "decode-capable workers).",
                            false,
                            {{"role", role}},
                            double(n)});
      }
    }
    s->extra.push_back({"tandem_slo_requests_total",
                        "Admitted requests with an SLO, by whether they completed within it.",
                        true,
                        {{"outcome", "met"}},
                        double(slo_met_)});
    s->extra.push_back(
        {"tandem_slo_requests_total", "", true, {{"outcome", "missed"}}, double(slo_missed_)});
  }
  s->extra_histograms.push_back({"tandem_predicted_ttft_seconds",
                                 "TTFT the conductor predicted at placement.",
                                 predicted_ttft_.Get()});
  s->extra_histograms.push_back(
      {"tandem_measured_ttft_seconds",
       "TTFT measured from placement (the span the prediction covers; waits before it excluded).",
       measured_ttft_.Get()});
  s->extra_histograms.push_back({"tandem_ttft_prediction_relative_error",
                                 "|predicted - measured| / measured TTFT.", ttft_error_.Get()});
  s->extra_histograms.push_back(
      {"tandem_tbt_prediction_relative_error",
       "|predicted - measured| / measured time between tokens (the decode step predicted when the "
       "request joined its batch against the request's mean TBT).",
       tbt_error_.Get()});
}

}  // namespace tandem::conductor
