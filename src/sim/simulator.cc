#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "conductor/cluster_view.h"

namespace tandem::sim {
namespace {

using conductor::AdmissionPolicy;
using conductor::Clock;
using conductor::ClusterView;
using conductor::Placement;
using conductor::WorkerRole;

// Simulated seconds as the conductor's clock (offset so that default time points lie before).
Clock::time_point TimeAt(double t) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t + 1e4)));
}

// The engine's prefix cache: block keys, least recently used first out. Mirrors its content
// into the conductor's view of the instance (what a /stats report would carry).
class PrefixCache {
 public:
  explicit PrefixCache(std::unordered_set<uint64_t>* mirror) : mirror_(mirror) {}

  int64_t size() const { return static_cast<int64_t>(index_.size()); }

  // Leading keys held (at most `max_blocks`), refreshed as most recent.
  int64_t Hit(const std::vector<uint64_t>& keys, int64_t max_blocks) {
    int64_t n = 0;
    while (n < max_blocks && n < static_cast<int64_t>(keys.size())) {
      auto it = index_.find(keys[n]);
      if (it == index_.end()) break;
      lru_.splice(lru_.end(), lru_, it->second);
      ++n;
    }
    return n;
  }
  void Insert(uint64_t k) {
    auto it = index_.find(k);
    if (it != index_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);
      return;
    }
    lru_.push_back(k);
    index_[k] = std::prev(lru_.end());
    mirror_->insert(k);
  }
  void Erase(uint64_t k) {
    auto it = index_.find(k);
    if (it == index_.end()) return;
    lru_.erase(it->second);
    index_.erase(it);
    mirror_->erase(k);
  }
  void ShrinkTo(int64_t capacity) {
    while (size() > std::max<int64_t>(0, capacity)) Erase(lru_.front());
  }

 private:
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
  std::unordered_set<uint64_t>* mirror_;
};

// Leading keys of `keys` found in `held`, at most `max_blocks`.
int64_t LeadingHeld(const std::vector<uint64_t>& keys, int64_t max_blocks,
                    const std::unordered_set<uint64_t>& held) {
  int64_t n = 0;
  while (n < max_blocks && n < static_cast<int64_t>(keys.size()) && held.count(keys[n])) ++n;
  return n;
}

enum class EventKind {
  kArrival,
  kCheckTurn,
  kPrefillEnd,
  kKvArrived,
  kStepEnd,
  kWaitDeadline,
  kPlan
};

struct Event {
  double t;
  uint64_t order;  // ties: first scheduled first
  EventKind kind;
  int id;  // request index or instance index
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

struct Req {
  const SimRequest* in = nullptr;
  conductor::RequestLoad load;
  double deadline = 0;
  Placement placement;
  std::string decode_name, prefill_name;
  int decode = -1, prefill = -1;  // instance indices (prefill -1: local)
  double committed_at = 0;
  bool dispatched = false, done = false, waiting_kv = false, waited_kv = false;
  int64_t reserved_blocks = 0;    // on the decode instance
  int64_t decode_hit_tokens = 0;  // prompt tokens its decode instance held already
  int64_t local_done = 0;         // local prefill: prompt tokens computed so far
  double dispatched_at = 0, prefill_started = 0, prefill_compute_s = 0, transfer_s = 0;
  double first_token_at = -1, last_token_at = 0;
  int emitted = 0;
  std::vector<float> gaps;
  RequestRecord rec;
};

struct Instance {
  std::string name;
  WorkerRole role = WorkerRole::kMixed;
  ClusterView::Worker* view = nullptr;
  std::unique_ptr<PrefixCache> cache;
  // Prefill side.
  std::deque<int> queue;  // requests waiting, in arrival order
  int running = -1;
  double nic_free_at = 0;
  // Decode side.
  std::vector<int> batch, joining;
  std::deque<int> local;                             // prompts computed here, in order
  std::vector<std::pair<int, int64_t>> step_chunks;  // this step's prompt chunks
  std::vector<int> pending_reservations;             // answered when the current step ends
  bool stepping = false;
  int64_t total_blocks = 0, used_blocks = 0;
  // Elastic pools: the role it drains towards (no new work meanwhile), when its role last
  // changed, and its busy share (moving average of the planner's samples).
  std::optional<WorkerRole> switching_to;
  double role_since = -1e9;
  double busy_at_sample = 0, busy_share = 0;
  InstanceRecord rec;
};

class Simulation {
 public:
  Simulation(const std::vector<SimRequest>& workload, const SimOptions& o)
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

  SimResult Run() {
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
    result_.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(result_);
  }

 private:
  // Prompt blocks a cache hit may cover: whole blocks, leaving at least one token to compute.
  int64_t MaxHitBlocks(const Req& r) const { return std::max(0, r.load.prompt_tokens - 1) / bt_; }

  // The prompt's whole blocks enter `cache` (most recent).
  void CachePrompt(const Req& r, PrefixCache* cache) const {
    const int64_t full = std::min<int64_t>(r.load.prompt_tokens / bt_, r.load.keys.size());
    for (int64_t b = 0; b < full; ++b) cache->Insert(r.load.keys[b]);
  }

  void Push(double t, EventKind kind, int id) { events_.push({t, order_++, kind, id}); }

  // The factor on one engine step: the engines' slowdown, times the noise.
  double Noise() { return o_.engine_scale * (o_.engine_noise > 0 ? std::exp(noise_(rng_)) : 1.0); }

  void AddBusy(Instance& inst, double from, double to) {
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

  void PublishKv(Instance& d) {
    d.view->stats.backend.kv_blocks_used = static_cast<int>(d.used_blocks);
  }

  int ExpectedOutput() const { return std::max(1, static_cast<int>(expected_output_)); }

  conductor::RequestShape ShapeOf(const Req& r) const {
    conductor::RequestShape s;
    s.prompt_tokens = r.load.prompt_tokens;
    s.max_tokens = r.load.max_tokens;
    s.expected_output_tokens = std::min(r.load.max_tokens, ExpectedOutput());
    s.slo_ttft_s = o_.slo_ttft_s;
    s.slo_tbt_s = o_.slo_tbt_s;
    return s;
  }

  // The policy over the view, as the conductor calls it (having asked the pool's master, as its
  // PoolDirectory does, how much of the prompt the pool holds).
  Placement PlaceNow(Req& r, AdmissionPolicy admission, std::string* decode, std::string* prefill) {
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

  void Commit(Req& r, const Placement& p, const std::string& decode, const std::string& prefill) {
    r.placement = p;
    r.decode_name = decode;
    r.prefill_name = prefill;
    r.decode = by_name_.at(decode);
    r.prefill = prefill.empty() ? -1 : by_name_.at(prefill);
    r.committed_at = now_;
    view_.Commit(r.load, p, decode, prefill, ExpectedOutput(), TimeAt(now_));
  }

  void Fail(Req& r, int status, const std::string& reason) {
    if (r.done) return;
    r.done = true;
    r.rec.ok = false;
    r.rec.status = status;
    r.rec.error = reason;
    r.rec.output_tokens = r.emitted;
  }

  // ---- elastic pools ----

  static cluster::Role ClusterRole(WorkerRole r) {
    return r == WorkerRole::kPrefill  ? cluster::Role::kPrefill
           : r == WorkerRole::kDecode ? cluster::Role::kDecode
                                      : cluster::Role::kMixed;
  }

  // The conductor's planner over the exact view; a chosen instance starts draining.
  void OnPlan() {
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
      in.workers.push_back(w);
    }
    const conductor::PlannerDecision d = conductor::PlanPools(in, o_.planner);
    ++result_
          .planner_decisions[std::string(conductor::PlannerActionName(d.action)) + "/" + d.reason];
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

  // Instances that drained take their new role.
  void FinishSwitches() {
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

  // ---- the conductor's request flow ----

  void OnArrival(int i) {
    Req& r = reqs_[i];
    std::string decode, prefill;
    const Placement p = PlaceNow(r, o_.placement.admission, &decode, &prefill);
    ++arrivals_;
    if (p.outcome == Placement::Outcome::kReject) {
      ++(p.reason == "ttft_slo" ? rejected_ttft_ : rejected_tbt_);
    }
    switch (p.outcome) {
      case Placement::Outcome::kNoWorker: Fail(r, 503, p.reason); return;
      case Placement::Outcome::kReject: Fail(r, 429, p.reason); return;
      case Placement::Outcome::kWait: EnterKvWait(i); return;
      case Placement::Outcome::kPlaced:
        Commit(r, p, decode, prefill);
        CheckTurn(i);
        return;
    }
  }

  void EnterKvWait(int i) {
    Req& r = reqs_[i];
    if (!r.waited_kv) ++result_.kv_waits;
    r.waited_kv = r.waiting_kv = true;
    kv_waiting_.push_back(i);
    Push(r.deadline, EventKind::kWaitDeadline, i);
  }

  void OnWaitDeadline(int i) {
    Req& r = reqs_[i];
    if (!r.waiting_kv || r.done) return;
    r.waiting_kv = false;
    kv_waiting_.erase(std::find(kv_waiting_.begin(), kv_waiting_.end(), i));
    Fail(r, 504, "kv_wait_deadline");
  }

  // KV room appeared on the instances in freed_: every waiter tries again, as the conductor's
  // waiting threads all wake and place themselves again. Only a waiter that one of those
  // instances could now hold (what it lacks there fits its free blocks) runs the policy:
  // nothing else changed since it last failed.
  void RetryKvWaiters() {
    std::vector<const Instance*> freed;
    for (int k : freed_) freed.push_back(instances_[k].get());
    freed_.clear();
    // Those waiting now, once each: one that fails again (its reservation refused) is back at
    // the end of the list for the next time.
    size_t left = kv_waiting_.size();
    for (auto it = kv_waiting_.begin(); it != kv_waiting_.end() && left > 0; --left) {
      const int i = *it;
      Req& r = reqs_[i];
      bool may_fit = false;
      for (const Instance* d : freed) {
        const int64_t hit = LeadingHeld(r.load.keys, MaxHitBlocks(r), d->view->reported_keys);
        const int need =
            conductor::DecodeBlocksNeeded(r.load.prompt_tokens, static_cast<int>(hit * bt_), bt_);
        if (need <= ClusterView::FreeBlocks(*d->view)) {
          may_fit = true;
          break;
        }
      }
      if (!may_fit) {
        ++it;
        continue;
      }
      std::string decode, prefill;
      const Placement p = PlaceNow(r, AdmissionPolicy::kNone, &decode, &prefill);
      if (p.outcome == Placement::Outcome::kWait) {
        ++it;
        continue;
      }
      it = kv_waiting_.erase(it);
      r.waiting_kv = false;
      if (p.outcome != Placement::Outcome::kPlaced) {
        Fail(r, 503, p.reason);
        continue;
      }
      Commit(r, p, decode, prefill);
      CheckTurn(i);
    }
  }

  // WaitForPrefillTurn: dispatch once little predicted work is ahead on its prefill worker.
  void CheckTurn(int i) {
    Req& r = reqs_[i];
    if (r.done || r.dispatched || r.waiting_kv) return;
    if (now_ >= r.deadline) {
      view_.Release(r.load.seq, r.decode_name, r.prefill_name);
      Fail(r, 504, "deadline");
      return;
    }
    const ClusterView::Worker* w = r.prefill >= 0 ? instances_[r.prefill]->view : nullptr;
    const double ahead = w ? ClusterView::QueueSeconds(*w, TimeAt(now_), r.load.seq) : 0;
    const double threshold = std::max(conductor::kDispatchAheadS, r.placement.predicted_prefill_s);
    if (ahead > threshold) {
      double next = ahead - threshold;
      if (o_.replace_interval_s > 0) {
        next = std::min(next, o_.replace_interval_s);
        Replace(r);
      }
      Push(now_ + std::max(1e-3, next), EventKind::kCheckTurn, i);
      return;
    }
    Instance& d = *instances_[r.decode];
    const int need =
        conductor::DecodeBlocksNeeded(r.load.prompt_tokens, r.placement.decode_cached_tokens, bt_);
    if (!view_.Dispatch(r.load.seq, r.decode_name, r.prefill_name, need, TimeAt(now_))) {
      view_.Release(r.load.seq, r.decode_name, r.prefill_name);
      EnterKvWait(i);
      return;
    }
    r.dispatched = true;
    r.dispatched_at = now_;
    // The decode worker answers a reservation between two steps of its loop.
    if (d.stepping) {
      d.pending_reservations.push_back(i);
      return;
    }
    ReserveAndStart(i, /*kick=*/true);
  }

  // The decode instance reserves the request's KV; then its prefill starts (queued on its
  // prefill instance, or as chunks of the decode instance's steps). `kick`: start the decode
  // instance's next step if it is idle (not from inside its step's end).
  void ReserveAndStart(int i, bool kick) {
    Req& r = reqs_[i];
    Instance& d = *instances_[r.decode];
    if (!Reserve(r, d)) {  // refused (429): back to waiting for room
      view_.Release(r.load.seq, r.decode_name, r.prefill_name);
      r.dispatched = false;
      EnterKvWait(i);
      return;
    }
    // The reservation is in the instance's figures at once: the promise is kept.
    d.view->promises.erase(r.load.seq);
    if (r.prefill < 0) {
      ++result_.local_prefills;
      r.rec.local = true;
      r.local_done = r.decode_hit_tokens;
      d.rec.cached_tokens += r.decode_hit_tokens;
      r.rec.cached_tokens = static_cast<int>(r.decode_hit_tokens);
      d.local.push_back(i);
      if (kick) Kick(d);
    } else {
      Instance& p = *instances_[r.prefill];
      p.queue.push_back(i);
      if (p.running < 0) StartNextPrefill(p);
    }
  }

  // kCacheLoad re-places a held request (the best worker may change as the queues move).
  void Replace(Req& r) {
    if (o_.placement.policy != conductor::PlacementPolicy::kCacheLoad) return;
    std::string decode, prefill;
    const Placement p = PlaceNow(r, AdmissionPolicy::kNone, &decode, &prefill);
    if (p.outcome != Placement::Outcome::kPlaced) return;
    if (decode == r.decode_name && prefill == r.prefill_name) return;
    view_.Release(r.load.seq, r.decode_name, r.prefill_name);
    Commit(r, p, decode, prefill);
  }

  // The decode instance reserves the prompt's KV blocks (what its cache holds is pinned).
  bool Reserve(Req& r, Instance& d) {
    const int64_t hit = d.cache->Hit(r.load.keys, MaxHitBlocks(r));
    const int64_t blocks = (r.load.prompt_tokens + 1 + bt_ - 1) / bt_;
    if (blocks > d.total_blocks - d.used_blocks) return false;
    for (int64_t b = 0; b < hit; ++b) d.cache->Erase(r.load.keys[b]);
    d.used_blocks += blocks;
    d.cache->ShrinkTo(d.total_blocks - d.used_blocks);
    r.reserved_blocks = blocks;
    r.decode_hit_tokens = hit * bt_;
    PublishKv(d);
    return true;
  }

  void FreeReservation(Req& r) {
    if (r.reserved_blocks == 0 || r.decode < 0) return;
    Instance& d = *instances_[r.decode];
    d.used_blocks -= r.reserved_blocks;
    r.reserved_blocks = 0;
    freed_.insert(r.decode);  // waiters try again after this event
    // The prompt's full blocks stay cached, evictable.
    CachePrompt(r, d.cache.get());
    d.cache->ShrinkTo(d.total_blocks - d.used_blocks);
    PublishKv(d);
  }

  // ---- prefill instances ----

  void StartNextPrefill(Instance& p) {
    while (!p.queue.empty()) {
      const int i = p.queue.front();
      p.queue.pop_front();
      Req& r = reqs_[i];
      if (now_ >= r.deadline) {  // the worker refuses a request past its deadline
        view_.Release(r.load.seq, r.decode_name, r.prefill_name);
        FreeReservation(r);
        Fail(r, 504, "deadline");
        continue;
      }
      const int64_t local = p.cache->Hit(r.load.keys, MaxHitBlocks(r)) * bt_;
      // The pool's part beyond the local prefix is read over the instance's link first.
      const int64_t pooled = pool_ ? pool_->Hit(r.load.keys, MaxHitBlocks(r)) * bt_ : 0;
      const int64_t cached = std::max(local, pooled);
      const int64_t fetched = cached - local;
      const InstanceProfile& prof = o_.profile;
      const double fetch_s = fetched > 0 ? static_cast<double>(fetched) * prof.kv_bytes_per_token /
                                                   prof.link_bytes_per_s +
                                               prof.link_latency_s
                                         : 0.0;
      const int64_t n_new = r.load.prompt_tokens - cached;
      const double dt = o_.profile.cost.PrefillSeconds(n_new, cached) * Noise() + fetch_s;
      r.rec.cached_tokens = static_cast<int>(cached);
      r.rec.pool_tokens = static_cast<int>(fetched);
      p.rec.pool_tokens += fetched;
      r.prefill_started = now_;
      r.prefill_compute_s = dt;
      p.rec.prefill_tokens += n_new;
      p.rec.cached_tokens += cached;
      p.rec.steps++;
      AddBusy(p, now_, now_ + dt);
      p.running = i;
      Push(now_ + dt, EventKind::kPrefillEnd, by_name_.at(p.name));
      return;
    }
    p.running = -1;
  }

  void OnPrefillEnd(int inst) {
    Instance& p = *instances_[inst];
    const int i = p.running;
    Req& r = reqs_[i];
    CachePrompt(r, p.cache.get());
    p.cache->ShrinkTo(o_.profile.PrefixCacheBlocks());
    if (pool_) {  // offered to the pool (least recently used out)
      CachePrompt(r, pool_.get());
      pool_->ShrinkTo(o_.pool_tokens / bt_);
    }
    // Layer-wise push: each layer's KV leaves as soon as it is computed; the link is shared
    // by this instance's transfers in order.
    const InstanceProfile& prof = o_.profile;
    const double bytes =
        static_cast<double>(r.load.prompt_tokens - r.decode_hit_tokens) * prof.kv_bytes_per_token;
    const double all_s = bytes / prof.link_bytes_per_s;
    const double start = std::max(r.prefill_started, p.nic_free_at);
    const double end = std::max(now_ + all_s / prof.layers, start + all_s);
    p.nic_free_at = end;
    r.transfer_s = end + prof.link_latency_s - now_;
    Push(end + prof.link_latency_s, EventKind::kKvArrived, i);
    StartNextPrefill(p);
  }

  void OnKvArrived(int i) {
    Req& r = reqs_[i];
    view_.PrefillDone(r.load, r.prefill_name, r.decode_name, r.transfer_s, TimeAt(now_));
    FirstToken(i);
    Kick(*instances_[r.decode]);
  }

  // The first token is out: the request joins its decode instance's batch at the next step
  // (the caller starts the instance).
  void FirstToken(int i) {
    Req& r = reqs_[i];
    r.first_token_at = r.last_token_at = now_;
    r.emitted = 1;
    view_.TokenEmitted(r.load.seq, r.decode_name);
    Instance& d = *instances_[r.decode];
    if (r.emitted >= r.load.max_tokens || now_ >= r.deadline) {
      Finish(i);
      return;
    }
    d.joining.push_back(i);
  }

  // ---- decode instances ----

  void Kick(Instance& d) {
    if (d.stepping || (d.batch.empty() && d.joining.empty() && d.local.empty())) return;
    // Sequences join up to max_num_seqs; the rest wait for a place (in order).
    const size_t cap =
        o_.profile.max_num_seqs > 0 ? static_cast<size_t>(o_.profile.max_num_seqs) : SIZE_MAX;
    size_t joined = 0;
    while (joined < d.joining.size() && d.batch.size() < cap)
      d.batch.push_back(d.joining[joined++]);
    d.joining.erase(d.joining.begin(), d.joining.begin() + joined);
    const conductor::CostModel& c = o_.profile.cost;
    const int64_t batch = static_cast<int64_t>(d.batch.size());
    int64_t context = 0;
    for (int i : d.batch) context += reqs_[i].load.prompt_tokens + reqs_[i].emitted;
    int64_t budget = std::max<int64_t>(0, o_.profile.max_batch_tokens - batch);
    d.step_chunks.clear();
    std::vector<conductor::CostModel::Chunk> chunks;
    for (int i : d.local) {
      if (budget <= 0) break;
      Req& r = reqs_[i];
      const int64_t chunk = std::min<int64_t>(budget, r.load.prompt_tokens - r.local_done);
      if (chunk <= 0) continue;
      chunks.push_back({chunk, r.local_done});
      d.step_chunks.push_back({i, chunk});
      budget -= chunk;
      d.rec.prefill_tokens += chunk;
    }
    // One fused forward pass (CostModel::MixedStepSeconds, the mock worker's step time too).
    double dt = c.MixedStepSeconds(batch, context, chunks);
    if (batch > 0) dt += o_.profile.step_overhead_s;
    dt *= Noise();
    d.stepping = true;
    d.rec.steps++;
    AddBusy(d, now_, now_ + dt);
    Push(now_ + dt, EventKind::kStepEnd, by_name_.at(d.name));
  }

  void OnStepEnd(int inst) {
    Instance& d = *instances_[inst];
    d.stepping = false;
    std::vector<int> still;
    still.reserve(d.batch.size());
    for (int i : d.batch) {
      Req& r = reqs_[i];
      const float gap = static_cast<float>(now_ - r.last_token_at);
      r.gaps.push_back(gap);
      r.last_token_at = now_;
      ++r.emitted;
      ++d.rec.decode_tokens;
      view_.TokenEmitted(r.load.seq, r.decode_name);
      // A new block when the sequence (prompt + generated, plus the next token) outgrows it.
      const int64_t need = (r.load.prompt_tokens + r.emitted + 1 + bt_ - 1) / bt_;
      if (need > r.reserved_blocks) {
        const int64_t more = need - r.reserved_blocks;
        d.cache->ShrinkTo(d.total_blocks - d.used_blocks - more);
        if (d.used_blocks + more > d.total_blocks) d.rec.kv_overflow_blocks += more;
        d.used_blocks += more;
        r.reserved_blocks = need;
        PublishKv(d);
      }
      if (r.emitted >= r.load.max_tokens || now_ >= r.deadline) {
        Finish(i);
      } else {
        still.push_back(i);
      }
    }
    d.batch.swap(still);
    for (const auto& [i, chunk] : d.step_chunks) {
      Req& r = reqs_[i];
      r.local_done += chunk;
      if (r.local_done < r.load.prompt_tokens) continue;
      d.local.erase(std::find(d.local.begin(), d.local.end(), i));
      r.transfer_s = 0;
      view_.PrefillDone(r.load, "", r.decode_name, -1, TimeAt(now_));
      FirstToken(i);
    }
    d.step_chunks.clear();
    std::vector<int> pending;
    pending.swap(d.pending_reservations);
    for (int i : pending) ReserveAndStart(i, /*kick=*/false);
    Kick(d);
  }

  void Finish(int i) {
    Req& r = reqs_[i];
    const bool deadline_hit = r.emitted < r.load.max_tokens;
    RequestRecord& rec = r.rec;
    rec.output_tokens = r.emitted;
    // The first token's delivery to the client (front door, relays) is not engine time.
    rec.ttft_s = r.first_token_at - r.in->arrival_s + o_.profile.ttft_overhead_s;
    rec.e2e_s = now_ - r.in->arrival_s;
    rec.prefill = r.prefill_name;
    rec.decode = r.decode_name;
    rec.predicted_tbt_s = r.placement.predicted_tbt_s;
    rec.kv_wait_s = r.committed_at - r.in->arrival_s;
    rec.hold_s = r.dispatched_at - r.committed_at;
    if (r.prefill >= 0) {
      rec.queue_s = r.prefill_started - r.dispatched_at;
      rec.prefill_s = r.prefill_compute_s;
      rec.transfer_s = r.transfer_s;
    } else {
      rec.prefill_s = r.first_token_at - r.dispatched_at;  // chunks in the decode steps
    }
    // Predicted from its (last) placement, counted here from its arrival.
    rec.predicted_ttft_s = r.placement.predicted_ttft_s + (r.committed_at - r.in->arrival_s);
    if (!r.gaps.empty()) {
      std::vector<float> g = r.gaps;
      const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(0.1 * g.size())));
      std::partial_sort(g.begin(), g.begin() + k, g.end(), std::greater<float>());
      double top = 0, sum = 0;
      for (size_t j = 0; j < k; ++j) top += g[j];
      for (float x : r.gaps) sum += x;
      rec.tbt_s = top / k;
      rec.mean_gap_s = sum / r.gaps.size();
      rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (r.emitted - 1);
      result_.gaps_s.insert(result_.gaps_s.end(), r.gaps.begin(), r.gaps.end());
      if (o_.keep_gaps) rec.gaps_s = r.gaps;
    }
    r.gaps.clear();
    r.gaps.shrink_to_fit();
    r.done = true;
    rec.ok = !deadline_hit;
    rec.status = deadline_hit ? 504 : 200;
    if (deadline_hit) rec.error = "deadline";
    // The conductor learns from what it measured (conductor_request.cc's Finish).
    expected_output_ = 0.9 * expected_output_ + 0.1 * r.emitted;
    if (rec.mean_gap_s > 0)
      view_.DecodeMeasured(r.decode_name, r.placement.predicted_tbt_s, rec.mean_gap_s);
    if (r.prefill >= 0) {
      view_.PrefillMeasured(r.prefill_name, r.load.prompt_tokens - r.rec.cached_tokens,
                            r.rec.cached_tokens, r.prefill_compute_s);
    }
    view_.Release(r.load.seq, r.decode_name, r.prefill_name);
    FreeReservation(r);
  }

  const SimOptions& o_;
  int bt_ = 16;
  ClusterView view_;
  std::vector<std::string> names_;
  std::unordered_set<uint64_t> pool_keys_;  // the pool's keys (its mirror)
  std::unique_ptr<PrefixCache> pool_;       // the cluster KV pool; null: none
  std::vector<std::unique_ptr<Instance>> instances_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<Req> reqs_;
  std::list<int> kv_waiting_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t order_ = 0;
  double now_ = 0, start_ = 0, end_ = 0;
  double expected_output_ = 64;
  std::set<int> freed_;  // decode instances whose KV room grew in this event
  int switching_ = 0;    // instances draining towards a new role
  double last_switch_ = -1e9;
  int64_t arrivals_ = 0, rejected_ttft_ = 0, rejected_tbt_ = 0;  // since the last plan
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_;
  SimResult result_;
};

}  // namespace

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
  Simulation sim(workload, o);
  return sim.Run();
}

}  // namespace tandem::sim
