#include "sim/simulator.h"

#include "sim/simulator_impl_internal.h"

namespace tandem::sim {
namespace internal {

Simulation::Simulation(const std::vector<SimRequest>& workload, const SimOptions& o)
    : o_(o), rng_(o.seed), noise_(0.0, std::max(0.0, o.engine_noise)) {
  const InstanceProfile& p = o.profile;
  bt_ = p.block_tokens;
  auto add = [&](const char* prefix, int count, WorkerRole role) {
    for (int i = 0; i < count; ++i) {
      auto inst = std::make_unique<Instance>();
      inst->name = std::string(prefix) + std::to_string(i);
      inst->role = role;
      ClusterView::Worker& w = view_.workers()[inst->name];
      w.info.name = inst->name;
      w.info.role = role == WorkerRole::kPrefill  ? cluster::Role::kPrefill
                    : role == WorkerRole::kDecode ? cluster::Role::kDecode
                                                  : cluster::Role::kMixed;
      w.info.block_tokens = bt_;
      w.info.max_batch_tokens = p.max_batch_tokens;
      w.info.max_num_seqs = p.max_num_seqs;
      w.info.cost = p.cost.Scaled(o.predicted_scale, o.predicted_scale);
      w.healthy = true;
      inst->view = &w;
      inst->cache = std::make_unique<PrefixCache>(&w.reported_keys);
      w.stats.pool_enabled = role == WorkerRole::kPrefill && o.pool_tokens > 0;
      if (role != WorkerRole::kPrefill) inst->total_blocks = p.KvBlocks();
      w.stats.backend.kv_blocks_total = static_cast<int>(inst->total_blocks);
      inst->rec.name = inst->name;
      inst->rec.role = role;
      by_name_[inst->name] = static_cast<int>(instances_.size());
      instances_.push_back(std::move(inst));
    }
  };
  if (o.pool_tokens > 0) pool_ = std::make_unique<PrefixCache>(&pool_keys_);
  add("p", o.prefill_instances, WorkerRole::kPrefill);
  add("d", o.decode_instances, WorkerRole::kDecode);
  add("m", o.mixed_instances, WorkerRole::kMixed);
  reqs_.resize(workload.size());
  for (size_t i = 0; i < workload.size(); ++i) {
    Req& r = reqs_[i];
    r.in = &workload[i];
    r.load.seq = i + 1;
    r.load.prompt_tokens = r.in->input_tokens;
    r.load.max_tokens = r.in->output_tokens;
    r.load.keys = r.in->keys;
    r.load.block_tokens = bt_;
    r.deadline = r.in->arrival_s + o.deadline_s;
    r.rec.index = r.in->index;
    r.rec.arrival_s = r.in->arrival_s;
    r.rec.input_tokens = r.in->input_tokens;
    r.rec.requested_output_tokens = r.in->output_tokens;
    Push(r.in->arrival_s, EventKind::kArrival, static_cast<int>(i));
  }
  start_ = workload.empty() ? 0 : workload.front().arrival_s;
  if (o.elastic && !workload.empty()) Push(start_ + o.planner_interval_s, EventKind::kPlan, 0);
}

SimResult Simulation::Run() {
  const auto wall0 = std::chrono::steady_clock::now();
  double last_expiry = 0;
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    now_ = e.t;
    ++result_.events;
    // The run lasts until its last event that still concerns a request (a deadline timer of
    // a request long served, or a turn check of one dispatched since, does not).
    const Req* about = e.kind == EventKind::kWaitDeadline || e.kind == EventKind::kCheckTurn
                           ? &reqs_[e.id]
                           : nullptr;
    const bool stale =
        e.kind == EventKind::kPlan ||
        (about != nullptr && (about->done || (e.kind == EventKind::kWaitDeadline
                                                  ? !about->waiting_kv
                                                  : about->dispatched || about->waiting_kv)));
    if (!stale) end_ = now_;
    if (now_ - last_expiry >= 1.0) {
      for (auto& inst : instances_) ClusterView::ExpirePlacedKeys(inst->view, TimeAt(now_));
      last_expiry = now_;
    }
    switch (e.kind) {
      case EventKind::kArrival: OnArrival(e.id); break;
      case EventKind::kCheckTurn: CheckTurn(e.id); break;
      case EventKind::kPrefillEnd: OnPrefillEnd(e.id); break;
      case EventKind::kKvArrived: OnKvArrived(e.id); break;
      case EventKind::kStepEnd: OnStepEnd(e.id); break;
      case EventKind::kWaitDeadline: OnWaitDeadline(e.id); break;
      case EventKind::kPlan: OnPlan(); break;
    }
    if (switching_ > 0) FinishSwitches();
    // KV room freed during the event: waiters try again once the event is done (never from
    // inside an instance's handler).
    if (!freed_.empty()) RetryKvWaiters();
  }
  result_.duration_s = std::max(0.0, end_ - start_);
  result_.utilisation_interval_s = o_.utilisation_interval_s;
  for (Req& r : reqs_) {
    r.rec.waited_for_kv = r.waited_kv;
    result_.requests.push_back(std::move(r.rec));
  }
  for (auto& inst : instances_) result_.instances.push_back(std::move(inst->rec));
  result_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return std::move(result_);
}

void Simulation::CachePrompt(const Req& r, PrefixCache* cache) const {
  const int64_t full = std::min<int64_t>(r.load.prompt_tokens / bt_, r.load.keys.size());
  for (int64_t b = 0; b < full; ++b) cache->Insert(r.load.keys[b]);
}

void Simulation::AddBusy(Instance& inst, double from, double to) {
  if (to <= from) return;
  inst.rec.busy_s += to - from;
  const double dt = o_.utilisation_interval_s;
  if (dt <= 0) return;
  auto& share = inst.rec.busy_share;
  for (double t = from; t < to;) {
    const size_t bucket = static_cast<size_t>((t - start_) / dt);
    const double bucket_end = start_ + (bucket + 1) * dt;
    const double piece = std::min(to, bucket_end) - t;
    if (share.size() <= bucket) share.resize(bucket + 1, 0.0);
    share[bucket] += piece / dt;
    t += piece;
    if (piece <= 0) break;
  }
}

void Simulation::PublishKv(Instance& d) {
  d.view->stats.backend.kv_blocks_used = static_cast<int>(d.used_blocks);
}

}  // namespace internal

StatusOr<SimResult> Simulate(const std::vector<SimRequest>& workload, const SimOptions& o) {
  if (o.prefill_instances < 0 || o.decode_instances < 0 || o.mixed_instances < 0 ||
      o.decode_instances + o.mixed_instances == 0) {
    return InvalidArgument("simulate: needs at least one decode or mixed instance");
  }
  if (o.prefill_instances > 0 && o.decode_instances + o.mixed_instances == 0) {
    return InvalidArgument("simulate: prefill instances need decode instances");
  }
  if (!o.profile.cost.valid() || o.profile.block_tokens <= 0 || o.profile.KvBlocks() <= 0) {
    return InvalidArgument("simulate: the profile needs a cost model, block_tokens and KV memory");
  }
  if (o.deadline_s <= 0 || o.predicted_scale <= 0 || o.engine_scale <= 0 || o.engine_noise < 0) {
    return InvalidArgument("simulate: deadline and the scales must be > 0, noise >= 0");
  }
  for (size_t i = 1; i < workload.size(); ++i) {
    if (workload[i].arrival_s < workload[i - 1].arrival_s) {
      return InvalidArgument("simulate: the workload must be in arrival order");
    }
  }
  internal::Simulation sim(workload, o);
  return sim.Run();
}

}  // namespace tandem::sim
