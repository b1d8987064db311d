#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace tandem
