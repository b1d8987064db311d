// ConductorImpl: heartbeats, membership refresh, the planner and its hook.
#include <sys/wait.h>

#include "conductor/conductor_impl_internal.h"

namespace tandem::conductor::internal {

void ConductorImpl::HeartbeatLoop() {
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

void ConductorImpl::PlanPools() {
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
      const Clock::time_point active = std::max(settled, w.last_busy_at);
      p.idle_s = active == Clock::time_point{} ? 1e9 : Seconds(now - active);
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
  } else {
    const Role to =
        d.action == PlannerDecision::Action::kToPrefill ? Role::kPrefill : Role::kDecode;
    log_->info("planner: {} to {} ({}: {})", names[d.worker], cluster::RoleName(to), d.reason,
               d.detail);
    (void)ChangeRole(names[d.worker], to, d.reason);  // a failure is logged; retried next time
  }
  if (options_.core_budget > 0) PlanCores(d.prefill_load, d.decode_load);
}

ThreadPlanInput ConductorImpl::CoresInputLocked(std::vector<std::string>* names) {
  const auto now = Clock::now();
  ThreadPlanInput in;
  in.cores = options_.core_budget;
  for (const auto& [name, w] : view_.workers()) {
    // A reservation is met by the first worker to join after it was made.
    for (auto it = reservations_.begin(); it != reservations_.end(); ++it) {
      if (w.joined_at > it->made) {
        reservations_.erase(it);
        break;
      }
    }
  }
  std::erase_if(reservations_, [&](const CoreReservation& r) { return r.until < now; });
  for (const CoreReservation& r : reservations_) in.reserved += r.cores;
  for (const auto& [name, w] : view_.workers()) {
    if (!w.listed) continue;  // it left (stopped): its cores are free
    ThreadPlanWorker t;
    t.name = name;
    t.role = ToPolicyRole(w.info.role);
    t.healthy = w.healthy;
    t.threads = w.info.threads;
    t.max_threads = w.info.max_threads;
    const Clock::time_point settled = std::max(w.threads_set_at, w.joined_at);
    t.since_resize_s = settled == Clock::time_point{} ? 1e9 : Seconds(now - settled);
    in.workers.push_back(t);
    names->push_back(name);
  }
  return in;
}

void ConductorImpl::ApplyThreadPlan(const ThreadPlan& plan, const ThreadPlanInput& in,
                                    const std::vector<std::string>& names, bool shrinks_only) {
  for (const bool shrinking : {true, false}) {
    if (!shrinking && shrinks_only) break;
    for (size_t i = 0; i < in.workers.size(); ++i) {
      const int from = in.workers[i].threads, to = plan.threads[i];
      if (to == from || (to < from) != shrinking) continue;
      // A failure is logged by ChangeThreads; the next plan sees the count the worker has.
      (void)ChangeThreads(names[i], to, plan.reason);
    }
  }
}

void ConductorImpl::PlanCores(double prefill_load, double decode_load) {
  MutexLock plan_lock(&threads_mu_);
  std::vector<std::string> names;
  ThreadPlanInput in;
  {
    MutexLock lock(&mu_);
    in = CoresInputLocked(&names);
  }
  in.prefill_load = prefill_load;
  in.decode_load = decode_load;
  metrics_.CoreBudget(in.cores, in.reserved);
  const ThreadPlan plan = PlanThreads(in, options_.thread_planner);
  if (plan.changes == 0) {
    log_->debug("thread planner: no change ({}): {}", plan.reason, plan.detail);
    return;
  }
  log_->info("thread planner: {}: {}", plan.reason, plan.detail);
  ApplyThreadPlan(plan, in, names, /*shrinks_only=*/false);
}

int ConductorImpl::ReserveCores(int wanted, Clock::duration hold) {
  if (options_.core_budget <= 0) return wanted;
  MutexLock plan_lock(&threads_mu_);
  std::vector<std::string> names;
  ThreadPlanInput in;
  {
    MutexLock lock(&mu_);
    in = CoresInputLocked(&names);
  }
  if (in.cores - in.reserved - ThreadsInUse(in) < wanted) {
    // Shrink as if the newcomer's cores were already held (no loads here: the largest workers
    // give first).
    ThreadPlanInput asked = in;
    asked.reserved += wanted;
    const ThreadPlan plan = PlanThreads(asked, options_.thread_planner);
    if (plan.reason == "over_budget" && plan.changes > 0) {
      log_->info("thread planner: cores for a starting worker: {}", plan.detail);
      ApplyThreadPlan(plan, asked, names, /*shrinks_only=*/true);
    }
  }
  MutexLock lock(&mu_);
  names.clear();
  in = CoresInputLocked(&names);
  const int granted = std::clamp(in.cores - in.reserved - ThreadsInUse(in), 0, wanted);
  if (granted > 0) {
    const auto now = Clock::now();
    reservations_.push_back({granted, now, now + hold});
  }
  metrics_.CoreBudget(in.cores, in.reserved + granted);
  return granted;
}

void ConductorImpl::RunPlannerHook(const PlannerDecision& d, const std::string& worker) {
  if (options_.planner_hook.empty() && !options_.on_scale) return;
  const auto now = Clock::now();
  {
    MutexLock lock(&mu_);
    if (last_hook_ != Clock::time_point{} && Seconds(now - last_hook_) < options_.planner.dwell_s) {
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

void ConductorImpl::ReapPlannerHooks() {
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

void ConductorImpl::JoinFinishedThreads() {
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

void ConductorImpl::RefreshMembership() {
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

void ConductorImpl::Suspect(const std::string& name) {
  MutexLock lock(&mu_);
  if (auto* w = view_.Find(name)) w->healthy = false;
}

std::shared_ptr<WorkerClient> ConductorImpl::ClientOf(const std::string& name) {
  MutexLock lock(&mu_);
  auto* w = view_.Find(name);
  return w ? w->client : nullptr;
}

}  // namespace tandem::conductor::internal
