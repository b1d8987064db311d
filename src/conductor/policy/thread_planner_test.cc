#include "conductor/policy/thread_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace tandem::conductor {
namespace {

ThreadPlanWorker Worker(const std::string& name, WorkerRole role, int threads, int max_threads) {
  ThreadPlanWorker w;
  w.name = name;
  w.role = role;
  w.healthy = true;
  w.threads = threads;
  w.max_threads = max_threads;
  return w;
}

// One prefill and one decode worker on `cores` cores, each allowed all of them.
ThreadPlanInput Host(int cores, int prefill_threads, int decode_threads, double prefill_load,
                     double decode_load) {
  ThreadPlanInput in;
  in.cores = cores;
  in.workers = {Worker("prefill-0", WorkerRole::kPrefill, prefill_threads, cores),
                Worker("decode-0", WorkerRole::kDecode, decode_threads, cores)};
  in.prefill_load = prefill_load;
  in.decode_load = decode_load;
  return in;
}

int Sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(ThreadPlannerTest, NoBudgetNoPlan) {
  const ThreadPlan p = PlanThreads(Host(0, 1, 1, 0.9, 0.0), {});
  EXPECT_EQ(p.reason, "balanced");
  EXPECT_EQ(p.changes, 0);
  EXPECT_EQ(p.threads, (std::vector<int>{1, 1}));
}

TEST(ThreadPlannerTest, LoadedPoolTakesACoreFromAnIdleOne) {
  // 8 cores split 4 + 4; decode above high, prefill below low: one core moves per plan.
  ThreadPlan p = PlanThreads(Host(8, 4, 4, 0.1, 0.9), {});
  EXPECT_EQ(p.reason, "decode_load");
  EXPECT_EQ(p.threads, (std::vector<int>{3, 5}));
  EXPECT_EQ(p.changes, 2);
  p = PlanThreads(Host(8, 4, 4, 0.95, 0.2), {});
  EXPECT_EQ(p.reason, "prefill_load");
  EXPECT_EQ(p.threads, (std::vector<int>{5, 3}));
  // The band between low and high is left alone, and so are two loaded pools.
  EXPECT_EQ(PlanThreads(Host(8, 4, 4, 0.5, 0.9), {}).reason, "balanced");
  EXPECT_EQ(PlanThreads(Host(8, 4, 4, 0.9, 0.9), {}).reason, "balanced");
  // A giver keeps one thread.
  p = PlanThreads(Host(8, 1, 7, 0.0, 0.99), {});
  EXPECT_EQ(p.reason, "balanced");
  EXPECT_EQ(p.changes, 0);
}

TEST(ThreadPlannerTest, DwellHoldsARecentlyResizedWorker) {
  ThreadPlanInput in = Host(8, 4, 4, 0.1, 0.9);
  in.workers[1].since_resize_s = 2;  // the taker changed 2 s ago
  EXPECT_EQ(PlanThreads(in, {.dwell_s = 5}).changes, 0);
  in.workers[1].since_resize_s = 6;
  in.workers[0].since_resize_s = 1;  // the giver too
  EXPECT_EQ(PlanThreads(in, {.dwell_s = 5}).changes, 0);
  in.workers[0].since_resize_s = 5;
  EXPECT_EQ(PlanThreads(in, {.dwell_s = 5}).threads, (std::vector<int>{3, 5}));
}

TEST(ThreadPlannerTest, SpareCoresGoToTheLoadedPoolUpToMax) {
  // A stopped worker left 3 of 4 cores unused: the decode worker (loaded) takes them up to its
  // max of 3; a worker that has not said its threads (just starting) gets none.
  ThreadPlanInput in = Host(4, 0, 1, 0.0, 0.8);
  in.workers = {Worker("decode-0", WorkerRole::kDecode, 1, 3),
                Worker("prefill-1", WorkerRole::kPrefill, 0, 0)};  // not joined yet: unknown
  ThreadPlan p = PlanThreads(in, {});
  EXPECT_EQ(p.reason, "spare_cores");
  EXPECT_EQ(p.threads, (std::vector<int>{3, 0}));
  in.workers.push_back(Worker("prefill-0", WorkerRole::kPrefill, 1, 4));
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{3, 0, 1}));  // 1 + 1 = 2 of 4 in use: +2 to decode
  in.workers[0].threads = 3;
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{3, 0, 1}));  // 4 of 4 in use: nothing spare
  EXPECT_EQ(p.reason, "balanced");
  // Mixed workers are in the decode pool.
  in = Host(4, 1, 1, 0.9, 0.1);
  in.workers[1].role = WorkerRole::kMixed;
  EXPECT_EQ(PlanThreads(in, {}).threads, (std::vector<int>{3, 1}));
}

TEST(ThreadPlannerTest, OverBudgetShrinksTheLessLoadedPoolFirstWhateverTheDwell) {
  // 2 cores: decode holds both (the prefill worker was stopped); a prefill worker is starting
  // and reserves one. The decode worker gives one back at once, resized or not.
  ThreadPlanInput in;
  in.cores = 2;
  in.reserved = 1;
  in.workers = {Worker("decode-0", WorkerRole::kDecode, 2, 2)};
  in.workers[0].since_resize_s = 0.5;
  in.decode_load = 0.9;
  ThreadPlan p = PlanThreads(in, {});
  EXPECT_EQ(p.reason, "over_budget");
  EXPECT_EQ(p.threads, (std::vector<int>{1}));
  // Several over: the idle pool's largest worker first, then the loaded pool's.
  in = Host(6, 3, 5, 0.1, 0.9);
  in.workers[0].max_threads = in.workers[1].max_threads = 8;
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{1, 5}));
  in.cores = 4;
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{1, 3}));
  EXPECT_EQ(Sum(p.threads), 4);
  // Nothing can go below one thread: the plan stays over budget rather than stop an engine.
  in.cores = 1;
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{1, 1}));
}

TEST(ThreadPlannerTest, UnhealthyOrSilentWorkersKeepTheirThreadsAndCount) {
  ThreadPlanInput in = Host(4, 2, 1, 0.0, 0.9);
  in.workers[0].healthy = false;  // its 2 threads still count: 1 core spare
  ThreadPlan p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{2, 2}));
  in.workers[0].healthy = true;
  in.workers[0].max_threads = 0;  // an older worker: not resizable
  p = PlanThreads(in, {});
  EXPECT_EQ(p.threads, (std::vector<int>{2, 2}));
}

// Over many random snapshots: the plan never exceeds the budget when the input did not, never
// takes a worker below 1 or above its max, and changes only resizable workers.
TEST(ThreadPlannerTest, PlansStayWithinBudgetAndLimits) {
  uint32_t seed = 7;
  auto next = [&](int n) {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<int>((seed >> 8) % n);
  };
  for (int round = 0; round < 2000; ++round) {
    ThreadPlanInput in;
    in.cores = 1 + next(16);
    in.reserved = next(3);
    const int n = 1 + next(5);
    for (int i = 0; i < n; ++i) {
      ThreadPlanWorker w =
          Worker("w" + std::to_string(i), next(2) ? WorkerRole::kPrefill : WorkerRole::kDecode,
                 1 + next(4), 0);
      w.max_threads = w.threads + next(4);
      w.healthy = next(8) != 0;
      w.since_resize_s = next(10);
      in.workers.push_back(w);
    }
    in.prefill_load = next(100) / 50.0;
    in.decode_load = next(100) / 50.0;
    const ThreadPlan p = PlanThreads(in, {});
    int before = 0;
    for (const auto& w : in.workers) before += w.threads;
    const int budget = std::max(0, in.cores - in.reserved);
    EXPECT_LE(Sum(p.threads), std::max(budget, before)) << p.detail;
    for (int i = 0; i < n; ++i) {
      const ThreadPlanWorker& w = in.workers[i];
      if (!w.healthy) {
        EXPECT_EQ(p.threads[i], w.threads);
      }
      EXPECT_GE(p.threads[i], 1);
      EXPECT_LE(p.threads[i], w.max_threads);
    }
  }
}

}  // namespace
}  // namespace tandem::conductor
