// Simulation: placement through the conductor's policy, and the planner's role switches.
#include "sim/simulator_impl_internal.h"

namespace tandem::sim::internal {

conductor::RequestShape Simulation::ShapeOf(const Req& r) const {
  conductor::RequestShape s;
  s.prompt_tokens = r.load.prompt_tokens;
  s.max_tokens = r.load.max_tokens;
  s.expected_output_tokens = std::min(r.load.max_tokens, ExpectedOutput());
  s.slo_ttft_s = o_.slo_ttft_s;
  s.slo_tbt_s = o_.slo_tbt_s;
  return s;
}

Placement Simulation::PlaceNow(Req& r, AdmissionPolicy admission, std::string* decode,
                               std::string* prefill) {
  ++result_.placements;
  if (pool_) {
    r.load.pool_prompt_tokens =
        static_cast<int>(LeadingHeld(r.load.keys, MaxHitBlocks(r), pool_keys_) * bt_);
  }
  const auto snapshot = view_.Snapshot(r.load, TimeAt(now_), &names_);
  conductor::PlacementOptions po = o_.placement;
  po.admission = admission;
  po.random_draw = rng_();
  const Placement p = conductor::Place(snapshot, ShapeOf(r), po);
  *decode = p.decode >= 0 ? names_[p.decode] : std::string();
  *prefill = p.prefill >= 0 && !p.local ? names_[p.prefill] : std::string();
  return p;
}

void Simulation::Commit(Req& r, const Placement& p, const std::string& decode,
                        const std::string& prefill) {
  r.placement = p;
  r.decode_name = decode;
  r.prefill_name = prefill;
  r.decode = by_name_.at(decode);
  r.prefill = prefill.empty() ? -1 : by_name_.at(prefill);
  r.committed_at = now_;
  view_.Commit(r.load, p, decode, prefill, ExpectedOutput(), TimeAt(now_));
}

void Simulation::Fail(Req& r, int status, const std::string& reason) {
  if (r.done) return;
  r.done = true;
  r.rec.ok = false;
  r.rec.status = status;
  r.rec.error = reason;
  r.rec.output_tokens = r.emitted;
}

cluster::Role Simulation::ClusterRole(WorkerRole r) {
  return r == WorkerRole::kPrefill  ? cluster::Role::kPrefill
         : r == WorkerRole::kDecode ? cluster::Role::kDecode
                                    : cluster::Role::kMixed;
}

void Simulation::OnPlan() {
  const double dt = o_.planner_interval_s;
  conductor::PlannerInput in;
  in.slo_ttft_s = o_.slo_ttft_s;
  in.slo_tbt_s = o_.slo_tbt_s;
  in.since_last_switch_s = now_ - last_switch_;
  if (arrivals_ > 0) {
    in.ttft_rejected_share = static_cast<double>(rejected_ttft_) / arrivals_;
    in.tbt_rejected_share = static_cast<double>(rejected_tbt_) / arrivals_;
  }
  arrivals_ = rejected_ttft_ = rejected_tbt_ = 0;
  for (auto& inst : instances_) {
    // Busy time is booked when a step starts: a share can exceed the interval's; clamp.
    const double share = std::clamp((inst->rec.busy_s - inst->busy_at_sample) / dt, 0.0, 1.0);
    inst->busy_at_sample = inst->rec.busy_s;
    if (share > 0) inst->last_busy = now_;
    inst->busy_share +=
        std::min(1.0, dt / conductor::kBusyAverageTime) * (share - inst->busy_share);
    conductor::PlannerWorker w;
    w.name = inst->name;
    w.role = inst->role;
    w.healthy = !inst->switching_to.has_value();  // draining: in neither pool
    w.since_switch_s = now_ - inst->role_since;
    w.prefill_queue_s = ClusterView::QueueSeconds(*inst->view, TimeAt(now_));
    w.decode_step_s = ClusterView::DecodeStepSeconds(*inst->view, &w.decoding);
    w.kv_used = inst->total_blocks > 0 ? double(inst->used_blocks) / inst->total_blocks : 0;
    w.seq_used = inst->view->info.max_num_seqs > 0
                     ? double(inst->view->decodes.size()) / inst->view->info.max_num_seqs
                     : 0;
    w.busy_share = inst->busy_share;
    w.idle_s = now_ - std::max(inst->last_busy, inst->role_since);
    in.workers.push_back(w);
  }
  const conductor::PlannerDecision d = conductor::PlanPools(in, o_.planner);
  ++result_.planner_decisions[std::string(conductor::PlannerActionName(d.action)) + "/" + d.reason];
  if (d.action != conductor::PlannerDecision::Action::kNone) {
    Instance& inst = *instances_[d.worker];
    inst.switching_to = d.action == conductor::PlannerDecision::Action::kToPrefill
                            ? WorkerRole::kPrefill
                            : WorkerRole::kDecode;
    inst.view->healthy = false;  // no new placements while it drains
    last_switch_ = now_;
    ++switching_;
  }
  // Plan while anything else is still to happen.
  if (!events_.empty()) Push(now_ + dt, EventKind::kPlan, 0);
}

void Simulation::FinishSwitches() {
  for (size_t k = 0; k < instances_.size(); ++k) {
    Instance& inst = *instances_[k];
    if (!inst.switching_to) continue;
    const ClusterView::Worker& v = *inst.view;
    const bool drained = inst.role == WorkerRole::kPrefill
                             ? inst.queue.empty() && inst.running < 0 && v.prefills.empty()
                             : !inst.stepping && inst.batch.empty() && inst.joining.empty() &&
                                   inst.local.empty() && inst.pending_reservations.empty() &&
                                   v.decodes.empty() && inst.used_blocks == 0;
    if (!drained) continue;
    inst.role = *inst.switching_to;
    inst.switching_to.reset();
    --switching_;
    ++result_.role_switches;
    inst.role_since = now_;
    inst.rec.role = inst.role;  // the record keeps its last role
    inst.rec.role_changes.push_back({now_ - start_, inst.role});
    inst.view->info.role = ClusterRole(inst.role);
    inst.view->healthy = true;
    if (inst.role == WorkerRole::kDecode) {
      inst.total_blocks = o_.profile.KvBlocks();
      inst.view->stats.backend.kv_blocks_total = static_cast<int>(inst.total_blocks);
      inst.cache->ShrinkTo(inst.total_blocks - inst.used_blocks);
      PublishKv(inst);
      freed_.insert(static_cast<int>(k));  // KV waiters may fit here now
    } else {
      inst.cache->ShrinkTo(o_.profile.PrefixCacheBlocks());
    }
  }
}

}  // namespace tandem::sim::internal
