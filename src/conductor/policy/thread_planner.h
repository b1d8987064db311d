// How many engine threads each worker of one host computes on, within the host's core budget:
// the part of elastic pools that moves cores rather than whole workers. A pure function like
// PlanPools; the conductor calls it every planner interval with the pools' loads (PlanPools'
// figures, 1.0 = at the SLO) and carries the plan out with POST /v1/threads.
//
// The budget is strict: the workers' threads add up to at most `cores` - `reserved` (reserved:
// cores promised to a worker being started), so no two engines ever share a core. Each plan is
// one of, in this order:
//   "over_budget"  the threads exceed the budget (a worker is starting, or the budget shrank):
//                  workers give threads back, those of the less loaded pool first and the
//                  largest first, down to 1 each; dwell does not hold this back.
//   "spare_cores"  cores of the budget are unused (a worker was stopped): they go to the
//                  workers of the more loaded pool first, those with the fewest threads first,
//                  up to each one's max_threads. An idle core helps nobody.
//   "prefill_load" / "decode_load"
//                  no core is spare, the named pool is above `high` and the other below `low`:
//                  one core moves from the other pool's worker with the most threads (more than
//                  1) to the loaded pool's worker with the fewest (below its max).
//   "balanced"     nothing to do (also: the band between low and high is left alone).
// A worker resized less than `dwell_s` ago is not grown or moved again (over_budget excepted),
// so cores do not oscillate. Mixed workers belong to the decode pool (they decode). Unhealthy
// workers and those that do not say their thread counts keep theirs, which still count.
#pragma once

#include <string>
#include <vector>

#include "conductor/policy/placement.h"

namespace tandem::conductor {

struct ThreadPlanWorker {
  std::string name;
  WorkerRole role = WorkerRole::kMixed;
  bool healthy = false;
  int threads = 0;              // now (0: unknown; not resized)
  int max_threads = 0;          // what it may be resized to (0: unknown; not resized)
  double since_resize_s = 1e9;  // since its thread count last changed (or it joined)
};

struct ThreadPlanInput {
  std::vector<ThreadPlanWorker> workers;
  int cores = 0;     // the budget (0: no plan)
  int reserved = 0;  // of it, promised to workers being started
  double prefill_load = 0, decode_load = 0;
};

struct ThreadPlanOptions {
  double high = 0.7;
  double low = 0.35;
  double dwell_s = 5;  // cheaper than a role move (nothing drains), so shorter by default
};

struct ThreadPlan {
  std::vector<int> threads;  // per input worker: its thread count once the plan is carried out
  std::string reason;        // see above
  std::string detail;        // a sentence with the figures, for the log
  int changes = 0;           // workers whose count changes
};

ThreadPlan PlanThreads(const ThreadPlanInput& in, const ThreadPlanOptions& options);

// The threads the input's workers compute on now, in all.
int ThreadsInUse(const ThreadPlanInput& in);

}  // namespace tandem::conductor
