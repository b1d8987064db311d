#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace tandem {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 64, 1000}) {
      for (int64_t grain : {1, 4, 32}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(
            n,
            [&](int64_t b, int64_t e, int t) {
              EXPECT_LT(t, threads);
              for (int64_t i = b; i < e; ++i) hits[i]++;
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain;
      }
    }
  }
}

TEST(ThreadPoolTest, RunOnAllRunsEachThreadIndex) {
  ThreadPool pool(4);
  for (int round = 0; round < 100; ++round) {
    std::vector<std::atomic<int>> seen(4);
    pool.RunOnAll([&](int t) { seen[t]++; });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

// Resizing between calls: every call uses exactly the active threads (indices below the count,
// each once), whatever the count was before, and shrinking to one runs on the caller alone.
TEST(ThreadPoolTest, ResizesBetweenCalls) {
  ThreadPool pool(2, 4);
  EXPECT_EQ(pool.num_threads(), 2);
  EXPECT_EQ(pool.max_threads(), 4);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 200; ++round) {
    const int want = 1 + (round * 7) % 6;  // 1..6: above max_threads clamps to 4
    const int set = pool.SetActiveThreads(want);
    ASSERT_EQ(set, std::min(want, 4));
    ASSERT_EQ(pool.num_threads(), set);
    for (int call = 0; call < 3; ++call) {
      std::vector<std::atomic<int>> seen(4);
      std::atomic<bool> only_caller{true};
      pool.RunOnAll([&](int t) {
        seen[t]++;
        if (std::this_thread::get_id() != caller) only_caller = false;
      });
      for (int t = 0; t < 4; ++t) ASSERT_EQ(seen[t].load(), t < set ? 1 : 0) << round;
      if (set == 1) {
        ASSERT_TRUE(only_caller.load());
      }
      std::vector<std::atomic<int>> hits(100);
      std::atomic<int> max_index{0};
      pool.ParallelFor(100, [&](int64_t b, int64_t e, int t) {
        max_index = std::max(max_index.load(), t);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      ASSERT_LT(max_index.load(), set);
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
  EXPECT_EQ(pool.SetActiveThreads(0), 1);
}

}  // namespace
}  // namespace tandem
