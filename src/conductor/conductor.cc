#include "conductor/conductor.h"

#include <sys/wait.h>

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
#include "conductor/metrics.h"
#include "conductor/pipelined_prefill.h"
#include "conductor/worker_client.h"
#include "serving/block_keys.h"
#include "store/pool.h"

namespace tandem::conductor {
namespace {

using cluster::DecodeCall;
using cluster::DecodeEvent;
using cluster::KvTarget;
using cluster::PrefillCall;
using cluster::PrefillResult;
using cluster::Role;
using cluster::WorkerInfo;

// Stats() refreshes the workers' figures first when they are older than this.
constexpr auto kStatsFreshness = std::chrono::milliseconds(30);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t MillisUntil(Clock::time_point t) {
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
PrefillCall PrefillCallFor(const RequestRun& run, const KvTarget& target) {
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
  explicit ConductorImpl(ConductorOptions o)
      : options_(std::move(o)), log_(GetLogger("conductor")), rng_(options_.random_seed) {
    if (options_.pool_aware) {
      store::PoolDirectoryOptions po;
      po.metadata = options_.metadata;
      auto dir = store::PoolDirectory::Create(po);
      if (dir.ok()) pool_directory_ = std::move(*dir);
    }
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~ConductorImpl() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    heartbeat_.join();
    // Request threads end by their deadlines; make them stop relaying now.
    cancel_all_.store(true);
    std::map<uint64_t, std::thread> threads;
    {
      MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (auto& [seq, t] : threads) t.join();
  }

  Status Submit(serving::GenerationRequest request,
                std::shared_ptr<serving::GenerationSink> sink) override TANDEM_EXCLUDES(mu_) {
    TANDEM_RETURN_IF_ERROR(
        serving::ValidateRequest(request, options_.vocab_size > 0 ? options_.vocab_size : INT32_MAX,
                                 options_.max_model_len > 0 ? options_.max_model_len : INT32_MAX));
    auto run = std::make_unique<RequestRun>();
    run->slo_ttft_s = request.slo_ttft_seconds > 0 ? request.slo_ttft_seconds : options_.slo_ttft_s;
    run->slo_tbt_s = request.slo_tbt_seconds > 0 ? request.slo_tbt_seconds : options_.slo_tbt_s;
    run->load.prompt_tokens = static_cast<int>(request.prompt_tokens.size());
    run->load.max_tokens = request.max_tokens;
    run->r = std::move(request);
    run->sink = std::move(sink);
    AskPool(run.get());  // outside the lock: a call
    MutexLock lock(&mu_);
    if (draining_ || stop_) return FailedPrecondition("the server is shutting down");
    if (active_ >= options_.max_inflight) {
      metrics_.Reject("inflight_limit");
      retry_after_s_.store(1.0);
      return ResourceExhausted("too many requests in flight (" +
                               std::to_string(options_.max_inflight) + ")");
    }
    run->load.seq = ++next_seq_;
    KeysFor(run.get());
    const Placement p = PlaceLocked(*run, options_.admission, {}, &run->decode, &run->prefill);
    ++arrivals_since_plan_;
    if (p.outcome == Placement::Outcome::kReject) {
      ++(p.reason == "ttft_slo" ? ttft_rejected_since_plan_ : tbt_rejected_since_plan_);
    }
    if (p.outcome == Placement::Outcome::kNoWorker) {
      metrics_.Reject(p.reason);
      return Unavailable(p.message);
    }
    if (p.outcome == Placement::Outcome::kReject) {
      metrics_.Reject(p.reason);
      retry_after_s_.store(p.retry_after_s);
      log_->info("{} rejected ({}): {}", run->r.id, p.reason, p.message);
      return ResourceExhausted(p.message);
    }
    run->placement = p;
    ++active_;
    const uint64_t seq = run->load.seq;
    threads_[seq] = std::thread([this, run = std::move(run)]() mutable { Run(std::move(run)); });
    return OkStatus();
  }

  int RetryAfterSeconds() const override {
    return std::max(1, static_cast<int>(std::ceil(retry_after_s_.load())));
  }

  serving::BackendStats Stats() const override TANDEM_EXCLUDES(mu_) {
    // The workers' figures are as fresh as the last heartbeat (up to `heartbeat` old): a scrape
    // right after a request ended could show it still holding KV. Refresh them first when the
    // last probe is older than a few tens of milliseconds (a probe is one local HTTP call per
    // worker). The refresh only updates the cached view, so Stats stays logically const.
    bool stale;
    {
      MutexLock lock(&mu_);
      stale = Clock::now() - last_refresh_ > kStatsFreshness && !stop_;
    }
    if (stale) const_cast<ConductorImpl*>(this)->RefreshMembership();
    serving::BackendStats s;
    {
      MutexLock lock(&mu_);
      ConductorMetrics::WorkerTotals totals;
      const auto now = Clock::now();
      for (const auto& [name, w] : view_.workers()) {
        totals.Add(w, name, now);
        if (!w.healthy) continue;
        const auto& b = w.stats.backend;
        s.running += b.running;
        s.waiting += b.waiting;
        s.kv_blocks_total += b.kv_blocks_total;
        s.kv_blocks_used += b.kv_blocks_used;
        s.kv_blocks_cached += b.kv_blocks_cached;
        s.kv_window_blocks_total += b.kv_window_blocks_total;
        s.kv_window_blocks_used += b.kv_window_blocks_used;
        s.prefix_cache_hit_tokens += b.prefix_cache_hit_tokens;
        s.pool_hit_tokens += b.pool_hit_tokens;
        s.prompt_tokens += b.prompt_tokens;
        s.generated_tokens += b.generated_tokens;
        s.preemptions += b.preemptions;
        s.preempt_offloaded_tokens += b.preempt_offloaded_tokens;
        s.preempt_resumed_cache_tokens += b.preempt_resumed_cache_tokens;
        s.preempt_resumed_pool_tokens += b.preempt_resumed_pool_tokens;
        s.preempt_recomputed_tokens += b.preempt_recomputed_tokens;
        s.pool_fetches_skipped += b.pool_fetches_skipped;
        s.reserved_blocks += b.reserved_blocks;
        s.reservations_expired += b.reservations_expired;
      }
      s.waiting += waiting_for_kv_;
      metrics_.Export(totals, &s);
    }
    if (options_.extra_metrics) options_.extra_metrics(&s);
    return s;
  }

  void Drain(Clock::time_point deadline) override TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    draining_ = true;
    auto idle = [&] {
      mu_.AssertHeld();  // called inside the waits, with mu_ held
      return active_ == 0;
    };
    if (!cv_.WaitUntil(&mu_, deadline, idle)) {
      cancel_all_.store(true);
      cv_.NotifyAll();
      cv_.WaitFor(&mu_, std::chrono::seconds(10), idle);
    }
  }

  Status WaitForWorkers(int prefill, int decode, Clock::time_point deadline) override
      TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto enough = [&] {
      mu_.AssertHeld();  // called inside the wait, with mu_ held
      int p = 0, d = 0;
      for (const auto& [name, w] : view_.workers()) {
        if (!w.healthy) continue;
        if (w.info.role == Role::kPrefill) ++p;
        if (cluster::CanDecode(w.info.role)) ++d;
      }
      return p >= prefill && d >= decode;
    };
    if (!cv_.WaitUntil(&mu_, deadline, enough)) {
      return DeadlineExceeded("workers did not join in time (wanted " + std::to_string(prefill) +
                              " prefill and " + std::to_string(decode) + " decode)");
    }
    return OkStatus();
  }

  std::vector<WorkerView> Workers() const override TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::vector<WorkerView> out;
    const auto now = Clock::now();
    for (const auto& [name, w] : view_.workers()) {
      out.push_back({w.info, w.healthy, static_cast<int>(w.placed.size()), w.stats,
                     ClusterView::QueueSeconds(w, now)});
    }
    return out;
  }

  void CountWorkerRestart(Role) override { metrics_.restarts.fetch_add(1); }

  Status ChangeRole(const std::string& worker, Role role, const std::string& reason) override
      TANDEM_EXCLUDES(mu_) {
    std::shared_ptr<WorkerClient> client;
    Role from;
    {
      MutexLock lock(&mu_);
      auto* w = view_.Find(worker);
      if (w == nullptr || !w->client) return NotFound("no worker named " + worker);
      client = w->client;
      from = w->info.role;
    }
    auto changed = client->ChangeRole({role, reason}, Clock::now() + std::chrono::seconds(5));
    if (!changed.ok()) {
      log_->warn("worker {} did not switch to {}: {}", worker, cluster::RoleName(role),
                 changed.status().ToString());
      return changed.status().WithContext("worker " + worker);
    }
    const auto now = Clock::now();
    {
      MutexLock lock(&mu_);
      if (auto* w = view_.Find(worker)) {
        w->info.role = role;
        w->role_set_at = now;
      }
      last_role_change_ = now;
    }
    if (changed->previous != role) {
      metrics_.RoleSwitched(cluster::RoleName(changed->previous), cluster::RoleName(role));
    }
    log_->info(
        "worker {} switched {} -> {} ({}); {} prefills and {} decode streams it held finish "
        "there",
        worker, cluster::RoleName(from), cluster::RoleName(role), reason,
        changed->prefills_in_flight, changed->decodes_in_flight);
    return OkStatus();
  }

 private:
  // ---- placement ----

  // Sets run->load.pool_prompt_tokens: prompt tokens (whole blocks, leaving one to compute) whose
  // KV the cluster pool holds, asked of its master; 0 without a pool, a master or an answer in
  // time (counted). The prompt's block keys it hashes stay in run->load (KeysFor keeps them).
  void AskPool(RequestRun* run) TANDEM_EXCLUDES(mu_) {
    const std::vector<int32_t>& prompt = run->r.prompt_tokens;
    if (!options_.pool_aware || !pool_directory_ || prompt.size() < 2) return;
    std::string ns;
    int bt = 0;
    {
      MutexLock lock(&mu_);
      for (const auto& [name, w] : view_.workers()) {
        if (w.healthy && w.stats.pool_enabled && !w.stats.pool_namespace.empty() &&
            w.info.role == cluster::Role::kPrefill && w.info.block_tokens > 0) {
          ns = w.stats.pool_namespace;
          bt = w.info.block_tokens;
          break;
        }
      }
    }
    if (ns.empty()) return;
    run->load.keys = serving::BlockKeys(prompt, bt);
    run->load.block_tokens = bt;
    const std::vector<uint64_t>& keys = run->load.keys;
    const size_t usable = std::min(keys.size(), (prompt.size() - 1) / static_cast<size_t>(bt));
    std::vector<std::string> objects;
    for (size_t i = 0; i < usable; ++i) objects.push_back(store::ObjectKey(ns, keys[i]));
    auto held = pool_directory_->HeldPrefix(objects, Clock::now() + std::chrono::milliseconds(100));
    metrics_.pool_lookups.fetch_add(1);
    if (!held.ok()) {
      metrics_.pool_lookup_failures.fetch_add(1);
      return;
    }
    metrics_.pool_predicted_tokens.fetch_add(int64_t{*held} * bt);
    run->load.pool_prompt_tokens = *held * bt;
  }

  // The prompt's block keys for the workers' block size (all workers of a cluster agree).
  void KeysFor(RequestRun* run) TANDEM_REQUIRES(mu_) {
    int bt = 0;
    for (const auto& [name, w] : view_.workers()) {
      if (w.info.block_tokens > 0) {
        bt = w.info.block_tokens;
        break;
      }
    }
    if (bt <= 0 || bt == run->load.block_tokens) return;
    run->load.block_tokens = bt;
    run->load.keys = serving::BlockKeys(run->r.prompt_tokens, bt);
  }

  RequestShape ShapeOf(const RequestRun& run) const TANDEM_REQUIRES(mu_) {
    RequestShape shape;
    shape.prompt_tokens = run.load.prompt_tokens;
    shape.max_tokens = run.load.max_tokens;
    shape.expected_output_tokens = std::min(run.load.max_tokens, ExpectedOutputLocked());
    shape.slo_ttft_s = run.slo_ttft_s;
    shape.slo_tbt_s = run.slo_tbt_s;
    return shape;
  }

  int ExpectedOutputLocked() const TANDEM_REQUIRES(mu_) {
    return std::max(1, static_cast<int>(expected_output_));
  }

  // Places `run` on the current view; *decode and *prefill get the chosen workers' names
  // (prefill empty when local or none).
  Placement PlaceLocked(const RequestRun& run, AdmissionPolicy admission,
                        std::span<const std::string> exclude_prefill, std::string* decode,
                        std::string* prefill) TANDEM_REQUIRES(mu_) {
    const auto now = Clock::now();
    const auto snapshot = view_.Snapshot(run.load, now, &names_scratch_);
    std::vector<int> exclude;
    for (size_t i = 0; i < names_scratch_.size(); ++i) {
      if (std::find(exclude_prefill.begin(), exclude_prefill.end(), names_scratch_[i]) !=
          exclude_prefill.end()) {
        exclude.push_back(static_cast<int>(i));
      }
    }
    PlacementOptions po;
    po.policy = options_.placement;
    po.admission = admission;
    po.allow_local_prefill = options_.local_prefill;
    po.random_draw = rng_();
    Placement p = Place(snapshot, ShapeOf(run), po, exclude);
    *decode = p.decode >= 0 ? names_scratch_[p.decode] : std::string();
    *prefill = p.prefill >= 0 && !p.local ? names_scratch_[p.prefill] : std::string();
    if (log_->should_log(spdlog::level::debug)) {
      std::string queues;
      for (const auto& w : snapshot) {
        queues += fmt::format(" {}:queue={:.3f}s,cached={},decoding={}", w.name, w.prefill_queue_s,
                              w.cached_prompt_tokens, w.decoding.size());
      }
      log_->debug("{} placed: outcome={} decode={} prefill={} local={} ttft={:.3f}s tbt={:.4f}s{}",
                  run.r.id, static_cast<int>(p.outcome), *decode, *prefill, p.local,
                  p.predicted_ttft_s, p.predicted_tbt_s, queues);
    }
    return p;
  }

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
  bool PlaceForRun(RequestRun* run, bool first, bool force_local, bool resume)
      TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    KvWait wait(this, run);
    // The decode worker computes the prompt itself: no prefill worker.
    auto make_local = [run](Placement& p) {
      p.local = true;
      p.prefill = -1;
      run->prefill.clear();
    };
    while (true) {
      Placement p;
      if (first) {
        p = run->placement;
      } else if (resume) {
        p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &run->decode, &run->prefill);
        make_local(p);
      } else if (force_local) {
        // The same decode worker computes the prompt itself (it was chosen for this request
        // and answered; a heartbeat may not have seen it since a stall).
        p = run->placement;
        make_local(p);
      } else {
        p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &run->decode, &run->prefill);
      }
      if (run->r.sampling.prompt_logprobs >= 0 && p.outcome == Placement::Outcome::kPlaced &&
          !p.local) {
        // Prompt logprobs come from the worker that computes the prompt with every position's
        // logits: the decode worker does it (the prefill hand-off carries no prompt logits).
        make_local(p);
      }
      first = false;
      if (p.outcome == Placement::Outcome::kPlaced) {
        run->placement = p;
        run->committed_at = Clock::now();
        view_.Commit(run->load, p, run->decode, run->prefill, ExpectedOutputLocked(),
                     run->committed_at);
        return true;
      }
      if (p.outcome == Placement::Outcome::kNoWorker && !resume) {
        run->error = Unavailable(p.message);
        return false;
      }
      if (p.outcome != Placement::Outcome::kNoWorker) wait.Start();  // kWait: no KV room now
      if (stop_ || cancel_all_.load()) {
        run->error = Cancelled("the server stopped");
        return false;
      }
      if (Clock::now() >= run->r.deadline) {
        run->error = DeadlineExceeded(
            p.outcome == Placement::Outcome::kNoWorker
                ? "no decode worker came back to continue the stream before the request deadline"
                : "no decode worker had room for the prompt's KV cache before the request "
                  "deadline");
        return false;
      }
      // Room appears when a request ends (notified) or a heartbeat shows evictable blocks.
      cv_.WaitUntil(&mu_, std::min(run->r.deadline, Clock::now() + std::chrono::milliseconds(100)));
    }
  }

  // Holds a request placed on a prefill worker until little predicted work is ahead of it
  // there, so that its decode reservation does not hold KV blocks idle through the prefill
  // queue; with kCacheLoad it is placed again meanwhile (the best worker, or local prefill, may
  // change as the queues move). False when the request cannot run (run->error says why).
  // Then promises the blocks its reservation takes on the decode worker, waiting for room.
  bool WaitForPrefillTurn(RequestRun* run, bool may_replace) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    KvWait wait(this, run);
    while (true) {
      const auto now = Clock::now();
      const ClusterView::Worker* w = run->prefill.empty() ? nullptr : view_.Find(run->prefill);
      const double ahead = w ? ClusterView::QueueSeconds(*w, now, run->load.seq) : 0;
      if (ahead <= std::max(kDispatchAheadS, run->placement.predicted_prefill_s)) {
        const ClusterView::Worker* d = view_.Find(run->decode);
        const int need =
            DecodeBlocksNeeded(run->load.prompt_tokens, run->placement.decode_cached_tokens,
                               d ? d->info.block_tokens : 0);
        if (view_.Dispatch(run->load.seq, run->decode, run->prefill, need, now)) return true;
        wait.Start();  // its turn, but no KV room on the decode worker now
      }
      if (stop_ || cancel_all_.load()) {
        run->error = Cancelled("the server stopped");
        return false;
      }
      if (now >= run->r.deadline) {
        run->error = DeadlineExceeded(
            wait.counted() ? "no decode worker had room for the prompt's KV cache before the "
                             "request deadline"
                           : serving::kRequestDeadlinePassed);
        return false;
      }
      cv_.WaitUntil(&mu_, std::min(run->r.deadline, now + std::chrono::milliseconds(50)));
      if (!may_replace || options_.placement != PlacementPolicy::kCacheLoad) continue;
      std::string decode, prefill;
      const Placement p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &decode, &prefill);
      if (p.outcome != Placement::Outcome::kPlaced) continue;  // keep the current one
      if (decode == run->decode && prefill == run->prefill) continue;
      view_.Release(run->load.seq, run->decode, run->prefill);
      run->placement = p;
      run->decode = decode;
      run->prefill = prefill;
      run->committed_at = Clock::now();
      view_.Commit(run->load, p, run->decode, run->prefill, ExpectedOutputLocked(),
                   run->committed_at);
    }
  }

  // ---- membership ----

  void HeartbeatLoop() TANDEM_EXCLUDES(mu_) {
    while (true) {
      {
        MutexLock lock(&mu_);
        auto stopped = [&] {
          mu_.AssertHeld();  // called inside the wait, with mu_ held
          return stop_;
        };
        if (cv_.WaitFor(&mu_, options_.heartbeat, stopped)) return;
      }
      RefreshMembership();
      JoinFinishedThreads();
      if (options_.elastic && Clock::now() >= next_plan_) {
        next_plan_ = Clock::now() + options_.planner_interval;
        PlanPools();
      }
    }
  }

  // ---- elastic pools ----

  // One decision of the planner on the current view, carried out (heartbeat thread).
  void PlanPools() TANDEM_EXCLUDES(mu_) {
    PlannerInput in;
    std::vector<std::string> names;
    {
      MutexLock lock(&mu_);
      const auto now = Clock::now();
      in.slo_ttft_s = options_.slo_ttft_s;
      in.slo_tbt_s = options_.slo_tbt_s;
      in.since_last_switch_s =
          last_role_change_ == Clock::time_point{} ? 1e9 : Seconds(now - last_role_change_);
      if (arrivals_since_plan_ > 0) {
        in.ttft_rejected_share = double(ttft_rejected_since_plan_) / arrivals_since_plan_;
        in.tbt_rejected_share = double(tbt_rejected_since_plan_) / arrivals_since_plan_;
      }
      arrivals_since_plan_ = ttft_rejected_since_plan_ = tbt_rejected_since_plan_ = 0;
      for (const auto& [name, w] : view_.workers()) {
        PlannerWorker p;
        p.name = name;
        p.role = ToPolicyRole(w.info.role);
        p.healthy = w.healthy;
        // Since it changed role or joined (a worker just started is not offered for removal).
        const Clock::time_point settled = std::max(w.role_set_at, w.joined_at);
        p.since_switch_s = settled == Clock::time_point{} ? 1e9 : Seconds(now - settled);
        p.prefill_queue_s = ClusterView::QueueSeconds(w, now);
        p.decode_step_s = ClusterView::DecodeStepSeconds(w, &p.decoding);
        const auto& b = w.stats.backend;
        p.kv_used = b.kv_blocks_total > 0 ? double(b.kv_blocks_used) / b.kv_blocks_total : 0;
        p.seq_used = w.info.max_num_seqs > 0 ? double(w.decodes.size()) / w.info.max_num_seqs : 0;
        p.busy_share = w.busy_share;
        in.workers.push_back(p);
        names.push_back(name);
      }
    }
    ReapPlannerHooks();
    const PlannerDecision d = conductor::PlanPools(in, options_.planner);
    metrics_.PlannerDecided(PlannerActionName(d.action), d.reason, d.prefill_workers,
                            d.decode_workers);
    if (d.scale != PlannerDecision::Scale::kNone) {
      RunPlannerHook(d, d.scale_worker >= 0 ? names[d.scale_worker] : std::string());
    }
    if (d.action == PlannerDecision::Action::kNone) {
      log_->debug("planner: no change ({}): {}", d.reason, d.detail);
      return;
    }
    const Role to =
        d.action == PlannerDecision::Action::kToPrefill ? Role::kPrefill : Role::kDecode;
    log_->info("planner: {} to {} ({}: {})", names[d.worker], cluster::RoleName(to), d.reason,
               d.detail);
    (void)ChangeRole(names[d.worker], to, d.reason);  // a failure is logged; retried next time
  }

  // Runs --planner-hook for a scale request (at most once per dwell time), without waiting:
  // a thread reaps it and counts its outcome.
  void RunPlannerHook(const PlannerDecision& d, const std::string& worker) TANDEM_EXCLUDES(mu_) {
    if (options_.planner_hook.empty() && !options_.on_scale) return;
    const auto now = Clock::now();
    {
      MutexLock lock(&mu_);
      if (last_hook_ != Clock::time_point{} &&
          Seconds(now - last_hook_) < options_.planner.dwell_s) {
        return;
      }
      last_hook_ = now;
    }
    const std::string request = PlannerScaleName(d);
    if (options_.on_scale) options_.on_scale(request, worker);
    if (options_.planner_hook.empty()) return;
    SpawnOptions so;
    so.argv = {"/bin/sh", "-c", options_.planner_hook};
    so.env = {{"TANDEM_PLANNER_REQUEST", request},
              {"TANDEM_PLANNER_WORKER", worker},
              {"TANDEM_PLANNER_PREFILL_LOAD", fmt::format("{:.3f}", d.prefill_load)},
              {"TANDEM_PLANNER_DECODE_LOAD", fmt::format("{:.3f}", d.decode_load)},
              {"TANDEM_PLANNER_PREFILL_WORKERS", std::to_string(d.prefill_workers)},
              {"TANDEM_PLANNER_DECODE_WORKERS", std::to_string(d.decode_workers)}};
    log_->info("planner: asking the orchestrator to {}{} ({})", request,
               worker.empty() ? "" : " " + worker, d.detail);
    auto child = Spawn(so);
    if (!child.ok()) {
      log_->warn("planner hook did not start: {}", child.status().ToString());
      metrics_.HookCalled(request, "failed");
      return;
    }
    hooks_running_.emplace_back(child->pid, request);
  }

  // Counts the hook runs that ended (planner thread; never waits).
  void ReapPlannerHooks() {
    for (auto it = hooks_running_.begin(); it != hooks_running_.end();) {
      int status = 0;
      const pid_t done = ::waitpid(it->first, &status, WNOHANG);
      if (done == 0) {
        ++it;
        continue;
      }
      const bool ok = done == it->first && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      metrics_.HookCalled(it->second, ok ? "ok" : "failed");
      if (!ok) log_->warn("planner hook for {} failed (wait status {})", it->second, status);
      it = hooks_running_.erase(it);
    }
  }

  void JoinFinishedThreads() TANDEM_EXCLUDES(mu_) {
    std::vector<std::thread> done;
    {
      MutexLock lock(&mu_);
      for (uint64_t seq : finished_threads_) {
        auto it = threads_.find(seq);
        if (it == threads_.end()) continue;
        done.push_back(std::move(it->second));
        threads_.erase(it);
      }
      finished_threads_.clear();
    }
    for (auto& t : done) t.join();
  }

  void RefreshMembership() TANDEM_EXCLUDES(refresh_mu_, mu_) {
    // One refresh at a time (the heartbeat thread and scrapes).
    MutexLock refreshing(&refresh_mu_);
    auto listed = options_.metadata->List(cluster::kWorkersPrefix);
    if (!listed.ok()) {
      log_->warn("cannot list workers: {}", listed.status().ToString());
      return;
    }
    std::vector<WorkerInfo> infos;
    for (const auto& [key, value] : *listed) {
      auto info = WorkerInfo::FromJson(value);
      if (info.ok()) infos.push_back(std::move(*info));
    }
    // Probe outside the lock: a slow worker must not stall placement.
    struct Probe {
      WorkerInfo info;
      StatusOr<cluster::WorkerStats> stats;
      Clock::time_point started;
    };
    std::vector<Probe> probes;
    for (auto& info : infos) {
      std::shared_ptr<WorkerClient> client;
      {
        MutexLock lock(&mu_);
        if (auto* w = view_.Find(info.name); w && w->info.incarnation == info.incarnation) {
          client = w->client;
        }
      }
      if (!client) client = std::make_shared<WorkerClient>(info.host, info.port);
      const auto started = Clock::now();
      auto stats = client->Stats(started + std::chrono::seconds(1));
      probes.push_back({std::move(info), std::move(stats), started});
    }
    MutexLock lock(&mu_);
    last_refresh_ = Clock::now();
    std::unordered_set<std::string> names;
    for (auto& pr : probes) {
      names.insert(pr.info.name);
      const std::string event =
          view_.ApplyProbe(pr.info, pr.stats, pr.started, options_.worker_timeout);
      if (event.empty()) continue;
      if (event == "stopped answering") {
        log_->warn("worker {} stopped answering; not placing requests there", pr.info.name);
      } else {
        log_->info("worker {} {} ({} on {}:{}, cost model: {})", pr.info.name, event,
                   cluster::RoleName(pr.info.role), pr.info.host, pr.info.port,
                   pr.info.cost.valid() ? pr.info.cost.source : "none");
      }
    }
    for (const auto& name : view_.MarkUnlisted(names)) {
      // Expected while shutting down (the workers unpublish themselves); a warning otherwise.
      log_->log(draining_ ? spdlog::level::info : spdlog::level::warn,
                "worker {} left the metadata service", name);
    }
    cv_.NotifyAll();
  }

  // Marks a worker unhealthy at once (a broken connection), until its next good heartbeat.
  void Suspect(const std::string& name) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (auto* w = view_.Find(name)) w->healthy = false;
  }

  std::shared_ptr<WorkerClient> ClientOf(const std::string& name) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto* w = view_.Find(name);
    return w ? w->client : nullptr;
  }

  // ---- one request ----

  // Runs the prefill of a reserved request, trying prefill workers until one succeeds.
  // Returns false when none could (the caller falls back to local).
  bool Prefill(RequestRun* run, const KvTarget& target) TANDEM_EXCLUDES(mu_) {
    if (PrefillPipelined(run, target)) return true;
    std::vector<std::string> tried;
    while (!run->prefill.empty()) {
      tried.push_back(run->prefill);
      const auto client = ClientOf(run->prefill);
      Status st;
      if (client) {
        bool connection_failed = false;
        auto result =
            client->Prefill(PrefillCallFor(*run, target), run->r.deadline, &connection_failed);
        if (result.ok()) {
          run->prefill_result = *result;
          MutexLock lock(&mu_);
          view_.PrefillDone(run->load, run->prefill, run->decode, result->transfer_seconds,
                            Clock::now());
          return true;
        }
        st = result.status().WithContext("prefill worker " + run->prefill);
        if (connection_failed) Suspect(run->prefill);
      } else {
        st = NotFound("prefill worker " + run->prefill + " is gone");
      }
      log_->warn("{}: prefill on {} failed: {}", run->r.id, run->prefill, st.ToString());
      if (Clock::now() >= run->r.deadline) {
        run->error = DeadlineExceeded(serving::kRequestDeadlinePassed);
        return false;
      }
      // Another prefill worker, not tried yet; the decode side and its reservation stay.
      MutexLock lock(&mu_);
      view_.Release(run->load.seq, "", run->prefill);
      std::string decode_unused, next;
      const Placement p = PlaceLocked(*run, AdmissionPolicy::kNone, tried, &decode_unused, &next);
      if (p.outcome != Placement::Outcome::kPlaced) next.clear();
      run->prefill = next;
      if (!next.empty()) {
        view_.ReassignPrefill(run->load.seq, next, p.predicted_prefill_s, Clock::now());
        metrics_.prefill_retries.fetch_add(1);
      }
    }
    return false;
  }

  // The prefill workers of a pipeline for `run` (ChoosePipelineGroup); fewer than two when it is
  // not to be pipelined (WantsPipeline).
  std::vector<StageWorker> PipelineGroup(const RequestRun& run, const KvTarget& target)
      TANDEM_EXCLUDES(mu_) {
    const int uncached =
        static_cast<int>(run.r.prompt_tokens.size()) - target.skip_blocks * target.block_tokens;
    if (run.prefill.empty() || !WantsPipeline(options_.pipeline, run.r.sampling, uncached)) {
      return {};
    }
    MutexLock lock(&mu_);
    return ChoosePipelineGroup(view_, run.prefill, options_.pipeline.max_stages, Clock::now());
  }

  // Prefills `run` on a pipeline of prefill workers when it qualifies (PipelineGroup); false
  // when it does not or the pipeline failed (one worker prefills it then).
  bool PrefillPipelined(RequestRun* run, const KvTarget& target) TANDEM_EXCLUDES(mu_) {
    const std::vector<StageWorker> group = PipelineGroup(*run, target);
    if (group.size() < 2) return false;
    const PrefillCall call = PrefillCallFor(*run, target);
    const std::string session =
        run->r.id + "/pipeline-" + std::to_string(pipeline_attempts_.fetch_add(1) + 1);
    auto done = RunPipelinedPrefill(call, group, options_.pipeline, session, run->r.deadline);
    if (!done.ok()) {
      metrics_.pipelined_failures.fetch_add(1);
      log_->warn("{}: pipelined prefill failed ({}); prefilling on {} alone", run->r.id,
                 done.status().ToString(), run->prefill);
      return false;
    }
    metrics_.pipelined_prefills.fetch_add(1);
    metrics_.pipeline_stage_bytes.fetch_add(static_cast<int64_t>(done->stage_bytes));
    std::string layout;
    for (size_t i = 0; i < group.size(); ++i) {
      layout += fmt::format("{}{} layers {}..{}", i ? ", " : "", group[i].info.name,
                            done->split.bounds[i], done->split.bounds[i + 1]);
    }
    log_->info(
        "{}: {} prompt tokens prefilled by a pipeline ({}) in chunks of {}: {:.2f} s (predicted "
        "{:.2f} s; one worker {:.2f} s), {:.1f} MiB between stages, a stage waited {:.2f} s for "
        "input at most",
        run->r.id, call.prompt_tokens.size(), layout, done->chunk_tokens,
        done->result.prefill_seconds, done->split.pipelined_seconds, done->split.single_seconds,
        done->stage_bytes / 1048576.0, done->most_wait_seconds);
    run->prefill_result = done->result;
    run->pipelined = true;
    MutexLock lock(&mu_);
    view_.PrefillDone(run->load, run->prefill, run->decode, done->result.transfer_seconds,
                      Clock::now());
    return true;
  }

  void Run(std::unique_ptr<RequestRun> run) TANDEM_EXCLUDES(mu_) {
    bool local_fallback = false;
    bool first = true;
    bool resume = false;  // the decode worker failed: continue on another one
    while (true) {
      if (!PlaceForRun(run.get(), first, local_fallback, resume)) {
        if (resume) metrics_.failed_migrations.fetch_add(1);
        break;
      }
      first = false;
      if (!WaitForPrefillTurn(run.get(), /*may_replace=*/!local_fallback && !resume)) {
        if (resume) metrics_.failed_migrations.fetch_add(1);
        MutexLock lock(&mu_);
        view_.Release(run->load.seq, run->decode, run->prefill);
        break;
      }
      if (resume) metrics_.migrations.fetch_add(1);
      const bool local = run->prefill.empty();
      if (local_fallback && !resume) metrics_.fallbacks.fetch_add(1);
      run->fall_back_local = run->retry_kv = false;
      resume = false;
      run->predicted_ttft_s = run->placement.predicted_ttft_s;
      run->predicted_tbt_s = run->placement.predicted_tbt_s;
      RunOnDecode(run.get(), local);
      {
        MutexLock lock(&mu_);
        view_.Release(run->load.seq, run->decode, run->prefill);
      }
      cv_.NotifyAll();
      if (run->cancelled || run->finish) break;
      if (!run->fall_back_local && !run->retry_kv && MayMigrate(*run)) {
        // The decode worker failed (mid-stream, or before its first token): another one (or
        // the restarted one) computes the prompt and the output so far, and continues the
        // same stream.
        log_->warn("{}: {} failed after {} tokens ({}); continuing the stream elsewhere", run->r.id,
                   run->decode, run->tokens, run->error.message());
        run->error = Status();
        ++run->migrations;
        resume = true;
        continue;
      }
      if (run->tokens > 0) break;
      if (run->retry_kv) {
        run->error = Status();
        continue;  // the decode worker had no room after all: wait for room, place again
      }
      if (!run->fall_back_local || local_fallback) break;
      local_fallback = true;  // no prefill worker could do it: the decode worker computes it
      log_->warn("{}: no prefill worker succeeded; computing the prompt on {}", run->r.id,
                 run->decode);
    }
    Finish(run.get(), local_fallback);
    {
      MutexLock lock(&mu_);
      --active_;
      finished_threads_.push_back(run->load.seq);
    }
    cv_.NotifyAll();
  }

  // Whether a stream that broke may continue on another decode worker: the worker failed (not
  // the request's own deadline or input), time and output are left, and it has not moved too
  // often already.
  bool MayMigrate(const RequestRun& run) const {
    constexpr int kMaxMigrations = 3;
    const StatusCode code = run.error.code();
    const bool worker_failed = code == StatusCode::kUnavailable || code == StatusCode::kInternal ||
                               code == StatusCode::kDataLoss;
    return worker_failed && !run.finish && !run.cancelled && !cancel_all_.load() &&
           run.migrations < kMaxMigrations && run.tokens < run.r.max_tokens &&
           run.r.sampling.prompt_logprobs < 0 && Clock::now() < run.r.deadline;
  }

  void Finish(RequestRun* run, bool fell_back) TANDEM_EXCLUDES(mu_) {
    const bool local = run->prefill.empty() && run->migrations == 0;
    if (!run->prefill.empty() && run->finish) metrics_.disaggregated.fetch_add(1);
    if (local && !fell_back && run->finish) metrics_.local_prefills.fetch_add(1);
    serving::FinishInfo info;
    const auto now = Clock::now();
    if (run->finish) {
      info = *run->finish;
    } else if (run->cancelled || cancel_all_.load()) {
      info.reason = serving::FinishReason::kCancelled;
      info.message = run->cancelled ? "cancelled by the client" : "the server stopped";
    } else {
      const Status e = run->error.ok()
                           ? Unavailable("decode worker " + run->decode + " ended the stream early")
                           : run->error;
      info.reason = e.code() == StatusCode::kDeadlineExceeded ? serving::FinishReason::kTimeout
                                                              : serving::FinishReason::kError;
      info.message = e.message();
      if (info.reason == serving::FinishReason::kError) metrics_.worker_failures.fetch_add(1);
    }
    info.prompt_tokens = run->load.prompt_tokens;
    info.completion_tokens = std::max(info.completion_tokens, run->tokens);
    info.total_seconds = Seconds(now - run->r.arrival);
    info.ttft_seconds = run->tokens > 0 ? Seconds(run->first_token_at - run->r.arrival) : 0;
    int computed_prompt = 0;
    if (run->prefill_result && !local) {
      info.cached_prompt_tokens = run->prefill_result->cached_tokens;
      info.queue_seconds =
          run->prefill_result->queue_seconds + Seconds(run->committed_at - run->r.arrival);
      info.prefill_seconds = run->prefill_result->prefill_seconds;
      info.kv_transfer_seconds = run->prefill_result->transfer_seconds;
      computed_prompt = run->load.prompt_tokens - run->prefill_result->cached_tokens;
    } else {
      // Not disaggregated: no hand-off to break the TTFT into.
      info.prefill_seconds = info.kv_transfer_seconds = info.first_decode_seconds = -1;
      if (!run->finish) info.queue_seconds = info.total_seconds;
      if (run->tokens > 0) computed_prompt = run->load.prompt_tokens - info.cached_prompt_tokens;
    }
    // Prediction quality and SLOs, for requests that produced tokens.
    if (run->tokens > 0) {
      const double ttft_from_placement = Seconds(run->first_token_at - run->committed_at);
      const double tbt =
          run->tokens > 1 ? Seconds(now - run->first_token_at) / (run->tokens - 1) : -1;
      metrics_.ObservePrediction(run->predicted_ttft_s, ttft_from_placement, run->predicted_tbt_s,
                                 tbt);
      const bool met = (run->slo_ttft_s <= 0 || info.ttft_seconds <= run->slo_ttft_s) &&
                       (run->slo_tbt_s <= 0 || tbt < 0 || tbt <= run->slo_tbt_s);
      const bool completed = run->finish && (run->finish->reason == serving::FinishReason::kStop ||
                                             run->finish->reason == serving::FinishReason::kLength);
      if (run->slo_ttft_s > 0 || run->slo_tbt_s > 0) metrics_.CountSlo(completed && met);
      metrics_.PrefillTokens(!completed ? "failed" : (met ? "slo_met" : "slo_missed"),
                             std::max(0, computed_prompt));
      MutexLock lock(&mu_);
      expected_output_ = 0.9 * expected_output_ + 0.1 * info.completion_tokens;
      if (tbt > 0) view_.DecodeMeasured(run->decode, run->predicted_tbt_s, tbt);
      if (run->prefill_result && !local && !run->pipelined) {
        const int cached = run->prefill_result->cached_tokens;
        view_.PrefillMeasured(run->prefill, run->load.prompt_tokens - cached, cached,
                              run->prefill_result->prefill_seconds);
      }
    }
    run->sink->OnFinish(info);
  }

  // One /v1/decode stream.
  void RunOnDecode(RequestRun* run, bool local) TANDEM_EXCLUDES(mu_) {
    const auto client = ClientOf(run->decode);
    if (!client) {
      run->error = Unavailable("decode worker " + run->decode + " is gone");
      return;
    }
    DecodeCall call;
    call.id = run->r.id;
    call.prompt_tokens = run->r.prompt_tokens;
    call.max_tokens = run->r.max_tokens;
    call.ignore_eos = run->r.ignore_eos;
    call.sampling = run->r.sampling;
    call.timeout_ms = MillisUntil(run->r.deadline);
    // The reservation lives as long as the request may: the conductor cancels it explicitly
    // when the prefill fails, and the worker frees it at the deadline if the conductor is gone.
    call.kv_wait_ms = call.timeout_ms;
    call.local = local;
    call.resumed_output = run->output;  // empty unless the stream resumes after a failure
    auto emit = [&](const engine::SampledToken& token) {
      if (run->tokens == 0) run->first_token_at = Clock::now();
      ++run->tokens;
      run->output.push_back(token.token);
      {
        MutexLock lock(&mu_);
        view_.TokenEmitted(run->load.seq, run->decode);
      }
      if (cancel_all_.load() || !run->sink->OnToken(token)) {
        run->cancelled = !cancel_all_.load();
        return false;
      }
      return true;
    };
    auto on_event = [&](const DecodeEvent& e) -> bool {
      switch (e.kind) {
        case DecodeEvent::Kind::kReserved: {
          {
            MutexLock lock(&mu_);
            view_.ReservationMade(run->load.seq, run->decode, Clock::now());
          }
          if (!Prefill(run, e.reserved)) {
            // Free the reservation, then (unless the deadline passed) redo it locally.
            client->Cancel(run->r.id, Clock::now() + std::chrono::seconds(2));
            run->fall_back_local = run->error.ok();
            return false;
          }
          return emit(run->prefill_result->first_token);
        }
        case DecodeEvent::Kind::kToken:
          if (local && run->tokens == 0) {
            MutexLock lock(&mu_);
            view_.PrefillDone(run->load, "", run->decode, -1, Clock::now());
          }
          return emit(e.token);
        case DecodeEvent::Kind::kPromptLogprobs:
          if (!cancel_all_.load()) run->sink->OnPromptLogprobs(e.prompt_logprobs);
          return true;
        case DecodeEvent::Kind::kFinish: run->finish = e.finish; return true;
        case DecodeEvent::Kind::kError: run->error = e.error; return true;
      }
      return true;
    };
    bool connection_failed = false;
    const Status st = client->Decode(call, run->r.deadline, on_event, &connection_failed);
    if (st.ok() || run->finish || run->cancelled || run->fall_back_local) return;
    if (st.code() == StatusCode::kResourceExhausted && run->tokens == 0) {
      run->retry_kv = true;  // no KV room on the decode worker after all
      return;
    }
    if (st.code() == StatusCode::kFailedPrecondition && run->tokens == 0) {
      // The worker no longer decodes (its role was switched by someone else than this
      // conductor): place the request again, without it until its next heartbeat shows its role.
      log_->info("{}: {} does not decode now; placing again", run->r.id, run->decode);
      Suspect(run->decode);
      run->retry_kv = true;
      return;
    }
    if (run->error.ok()) {
      if (connection_failed) Suspect(run->decode);
      run->error = st.WithContext("decode worker " + run->decode);
    }
  }

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

  std::thread heartbeat_;  // last: starts after the members above exist
};

}  // namespace

StatusOr<std::unique_ptr<Conductor>> Conductor::Start(ConductorOptions options) {
  if (!options.metadata) return InvalidArgument("the conductor needs a metadata store");
  return std::unique_ptr<Conductor>(std::make_unique<ConductorImpl>(std::move(options)));
}

}  // namespace tandem::conductor
