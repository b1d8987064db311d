// The simulator's implementation (simulator.h has the interface), split by concern:
//   simulator.cc            the event loop, the prefix caches, busy time, Simulate()
//   simulator_placement.cc  placement through the conductor's policy, the planner's switches
//   simulator_requests.cc   one request's events: arrival, prefill turn, KV, decode steps, finish
// Internal to src/sim.
#pragma once

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
#include "sim/simulator.h"

namespace tandem::sim::internal {

using conductor::AdmissionPolicy;
using conductor::Clock;
using conductor::ClusterView;
using conductor::Placement;
using conductor::WorkerRole;

// Simulated seconds as the conductor's clock (offset so that default time points lie before).
inline Clock::time_point TimeAt(double t) {
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
inline int64_t LeadingHeld(const std::vector<uint64_t>& keys, int64_t max_blocks,
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
  double last_busy = -1e9;  // the last planner interval in which it computed
  InstanceRecord rec;
};

class Simulation {
 public:
  Simulation(const std::vector<SimRequest>& workload, const SimOptions& o);
  SimResult Run();

 private:
  // Prompt blocks a cache hit may cover: whole blocks, leaving at least one token to compute.
  int64_t MaxHitBlocks(const Req& r) const { return std::max(0, r.load.prompt_tokens - 1) / bt_; }

  // The prompt's whole blocks enter `cache` (most recent).
  void CachePrompt(const Req& r, PrefixCache* cache) const;
  void Push(double t, EventKind kind, int id) { events_.push({t, order_++, kind, id}); }

  // The factor on one engine step: the engines' slowdown, times the noise.
  double Noise() { return o_.engine_scale * (o_.engine_noise > 0 ? std::exp(noise_(rng_)) : 1.0); }

  void AddBusy(Instance& inst, double from, double to);
  void PublishKv(Instance& d);
  int ExpectedOutput() const { return std::max(1, static_cast<int>(expected_output_)); }

  conductor::RequestShape ShapeOf(const Req& r) const;

  // The policy over the view, as the conductor calls it (having asked the pool's master, as its
  // PoolDirectory does, how much of the prompt the pool holds).
  Placement PlaceNow(Req& r, AdmissionPolicy admission, std::string* decode, std::string* prefill);
  void Commit(Req& r, const Placement& p, const std::string& decode, const std::string& prefill);
  void Fail(Req& r, int status, const std::string& reason);

  // ---- elastic pools ----

  static cluster::Role ClusterRole(WorkerRole r);

  // The conductor's planner over the exact view; a chosen instance starts draining.
  void OnPlan();

  // Instances that drained take their new role.
  void FinishSwitches();

  // ---- the conductor's request flow ----

  void OnArrival(int i);
  void EnterKvWait(int i);
  void OnWaitDeadline(int i);

  // KV room appeared on the instances in freed_: every waiter tries again, as the conductor's
  // waiting threads all wake and place themselves again. Only a waiter that one of those
  // instances could now hold (what it lacks there fits its free blocks) runs the policy:
  // nothing else changed since it last failed.
  void RetryKvWaiters();

  // WaitForPrefillTurn: dispatch once little predicted work is ahead on its prefill worker.
  void CheckTurn(int i);

  // The decode instance reserves the request's KV; then its prefill starts (queued on its
  // prefill instance, or as chunks of the decode instance's steps). `kick`: start the decode
  // instance's next step if it is idle (not from inside its step's end).
  void ReserveAndStart(int i, bool kick);

  // kCacheLoad re-places a held request (the best worker may change as the queues move).
  void Replace(Req& r);

  // The decode instance reserves the prompt's KV blocks (what its cache holds is pinned).
  bool Reserve(Req& r, Instance& d);
  void FreeReservation(Req& r);

  // ---- prefill instances ----

  void StartNextPrefill(Instance& p);
  void OnPrefillEnd(int inst);
  void OnKvArrived(int i);

  // The first token is out: the request joins its decode instance's batch at the next step
  // (the caller starts the instance).
  void FirstToken(int i);

  // ---- decode instances ----

  void Kick(Instance& d);
  void OnStepEnd(int inst);
  void Finish(int i);
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

}  // namespace tandem::sim::internal
