#include "conductor/conductor.h"

#include "conductor/conductor_impl_internal.h"

namespace tandem::conductor {
namespace internal {
namespace {

// Stats() refreshes the workers' figures first when they are older than this.
constexpr auto kStatsFreshness = std::chrono::milliseconds(30);

}  // namespace

ConductorImpl::ConductorImpl(ConductorOptions o)
    : options_(std::move(o)), log_(GetLogger("conductor")), rng_(options_.random_seed) {
  if (options_.pool_aware) {
    store::PoolDirectoryOptions po;
    po.metadata = options_.metadata;
    auto dir = store::PoolDirectory::Create(po);
    if (dir.ok()) pool_directory_ = std::move(*dir);
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

ConductorImpl::~ConductorImpl() {
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

Status ConductorImpl::Submit(serving::GenerationRequest request,
                             std::shared_ptr<serving::GenerationSink> sink) {
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

int ConductorImpl::RetryAfterSeconds() const {
  return std::max(1, static_cast<int>(std::ceil(retry_after_s_.load())));
}

serving::BackendStats ConductorImpl::Stats() const {
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
      s.pool_window_misses += b.pool_window_misses;
      s.reserved_blocks += b.reserved_blocks;
      s.reservations_expired += b.reservations_expired;
    }
    s.waiting += waiting_for_kv_;
    metrics_.Export(totals, &s);
  }
  if (options_.extra_metrics) options_.extra_metrics(&s);
  return s;
}

void ConductorImpl::Drain(Clock::time_point deadline) {
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

Status ConductorImpl::WaitForWorkers(int prefill, int decode, Clock::time_point deadline) {
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

std::vector<WorkerView> ConductorImpl::Workers() const {
  MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  const auto now = Clock::now();
  for (const auto& [name, w] : view_.workers()) {
    out.push_back({w.info, w.healthy, static_cast<int>(w.placed.size()), w.stats,
                   ClusterView::QueueSeconds(w, now)});
  }
  return out;
}

Status ConductorImpl::ChangeRole(const std::string& worker, Role role, const std::string& reason) {
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
      worker, cluster::RoleName(from), cluster::RoleName(role), reason, changed->prefills_in_flight,
      changed->decodes_in_flight);
  return OkStatus();
}

Status ConductorImpl::ChangeThreads(const std::string& worker, int threads,
                                    const std::string& reason) {
  std::shared_ptr<WorkerClient> client;
  {
    MutexLock lock(&mu_);
    auto* w = view_.Find(worker);
    if (w == nullptr || !w->client) return NotFound("no worker named " + worker);
    client = w->client;
  }
  auto changed = client->ChangeThreads({threads, reason}, Clock::now() + std::chrono::seconds(5));
  if (!changed.ok()) {
    log_->warn("worker {} did not change to {} threads: {}", worker, threads,
               changed.status().ToString());
    return changed.status().WithContext("worker " + worker);
  }
  {
    MutexLock lock(&mu_);
    if (auto* w = view_.Find(worker)) {
      if (w->info.threads != changed->threads) w->prefill_scale = w->decode_scale = 1.0;
      w->info.threads = changed->threads;
      w->threads_set_at = Clock::now();
    }
  }
  if (changed->previous != changed->threads) {
    metrics_.ThreadsChanged(reason, changed->previous, changed->threads);
    log_->info("worker {} computes on {} threads (was {}; {})", worker, changed->threads,
               changed->previous, reason);
  }
  return OkStatus();
}

}  // namespace internal

StatusOr<std::unique_ptr<Conductor>> Conductor::Start(ConductorOptions options) {
  if (!options.metadata) return InvalidArgument("the conductor needs a metadata store");
  return std::unique_ptr<Conductor>(std::make_unique<internal::ConductorImpl>(std::move(options)));
}

}  // namespace tandem::conductor
