#include "conductor/policy/thread_planner.h"

#include <fmt/format.h>

#include <algorithm>

namespace tandem::conductor {

namespace {

bool IsPrefill(const ThreadPlanWorker& w) { return w.role == WorkerRole::kPrefill; }

bool Resizable(const ThreadPlanWorker& w) {
  return w.healthy && w.threads > 0 && w.max_threads >= w.threads;
}

// The worker, among those `eligible`, that comes first by `before`; -1 if none.
template <typename Eligible, typename Before>
int Pick(size_t n, Eligible eligible, Before before) {
  int best = -1;
  for (size_t i = 0; i < n; ++i) {
    if (!eligible(static_cast<int>(i))) continue;
    if (best < 0 || before(static_cast<int>(i), best)) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace

int ThreadsInUse(const ThreadPlanInput& in) {
  int used = 0;
  for (const ThreadPlanWorker& w : in.workers) used += std::max(0, w.threads);
  return used;
}

ThreadPlan PlanThreads(const ThreadPlanInput& in, const ThreadPlanOptions& options) {
  ThreadPlan plan;
  const size_t n = in.workers.size();
  for (const ThreadPlanWorker& w : in.workers) plan.threads.push_back(w.threads);
  plan.reason = "balanced";
  if (in.cores <= 0) return plan;
  auto load_of = [&](int i) { return IsPrefill(in.workers[i]) ? in.prefill_load : in.decode_load; };
  auto settled = [&](int i) { return in.workers[i].since_resize_s >= options.dwell_s; };
  int used = ThreadsInUse(in);
  const int used_before = used;
  const int budget = std::max(0, in.cores - in.reserved);

  if (used > budget) {
    plan.reason = "over_budget";
    while (used > budget) {
      const int i = Pick(
          n, [&](int k) { return Resizable(in.workers[k]) && plan.threads[k] > 1; },
          [&](int a, int b) {
            if (load_of(a) != load_of(b)) return load_of(a) < load_of(b);
            return plan.threads[a] > plan.threads[b];
          });
      if (i < 0) break;  // every resizable worker is at 1 thread
      --plan.threads[i];
      --used;
    }
  } else if (used < budget) {
    plan.reason = "spare_cores";
    while (used < budget) {
      const int i = Pick(
          n,
          [&](int k) {
            return Resizable(in.workers[k]) && settled(k) &&
                   plan.threads[k] < in.workers[k].max_threads;
          },
          [&](int a, int b) {
            if (load_of(a) != load_of(b)) return load_of(a) > load_of(b);
            return plan.threads[a] < plan.threads[b];
          });
      if (i < 0) break;  // nobody can take more
      ++plan.threads[i];
      ++used;
    }
  } else {
    // The budget is full: move one core from a pool below low to one above high.
    for (const bool to_prefill : {true, false}) {
      const double need = to_prefill ? in.prefill_load : in.decode_load;
      const double give = to_prefill ? in.decode_load : in.prefill_load;
      if (need <= options.high || give >= options.low) continue;
      const int taker = Pick(
          n,
          [&](int k) {
            return Resizable(in.workers[k]) && settled(k) &&
                   IsPrefill(in.workers[k]) == to_prefill &&
                   plan.threads[k] < in.workers[k].max_threads;
          },
          [&](int a, int b) { return plan.threads[a] < plan.threads[b]; });
      const int giver = Pick(
          n,
          [&](int k) {
            return Resizable(in.workers[k]) && settled(k) &&
                   IsPrefill(in.workers[k]) != to_prefill && plan.threads[k] > 1;
          },
          [&](int a, int b) { return plan.threads[a] > plan.threads[b]; });
      if (taker < 0 || giver < 0) continue;
      ++plan.threads[taker];
      --plan.threads[giver];
      plan.reason = to_prefill ? "prefill_load" : "decode_load";
      break;
    }
  }
  std::string moves;
  for (size_t i = 0; i < n; ++i) {
    if (plan.threads[i] == in.workers[i].threads) continue;
    ++plan.changes;
    moves += fmt::format("{}{} {}->{}", moves.empty() ? "" : ", ", in.workers[i].name,
                         in.workers[i].threads, plan.threads[i]);
  }
  std::string outcome = moves;
  if (plan.changes == 0 && plan.reason != "balanced") {
    outcome = plan.reason + ", but no worker can change (at its limits or within dwell)";
    plan.reason = "balanced";
  }
  plan.detail = fmt::format(
      "{} of {} cores in use ({} reserved), prefill load {:.2f}, decode load {:.2f}{}{}",
      used_before, in.cores, in.reserved, in.prefill_load, in.decode_load,
      outcome.empty() ? "" : ": ", outcome);
  return plan;
}

}  // namespace tandem::conductor
