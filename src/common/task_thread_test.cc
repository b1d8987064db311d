#include "common/task_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace tandem {
namespace {

TEST(TaskThreadTest, RunsTasksInOrderOnOneOtherThread) {
  std::vector<int> order;
  std::thread::id ran_on;
  {
    TaskThread t;
    for (int i = 0; i < 100; ++i) {
      t.Post([&order, &ran_on, i] {
        if (i == 0) ran_on = std::this_thread::get_id();
        EXPECT_EQ(std::this_thread::get_id(), ran_on);
        order.push_back(i);
      });
    }
  }  // the destructor runs what was posted, then joins
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(TaskThreadTest, TakesTasksFromManyThreads) {
  std::atomic<int> ran{0};
  {
    TaskThread t;
    std::vector<std::thread> posters;
    for (int p = 0; p < 4; ++p) {
      posters.emplace_back([&] {
        for (int i = 0; i < 250; ++i) t.Post([&] { ran.fetch_add(1); });
      });
    }
    for (auto& p : posters) p.join();
  }
  EXPECT_EQ(ran.load(), 1000);
}

}  // namespace
}  // namespace tandem
