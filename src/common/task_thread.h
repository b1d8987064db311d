// One thread that runs posted tasks, one at a time, in the order posted: for work that may block
// (a call to another process) and must not run on an event loop or hold a request's thread.
//
//   TaskThread submitter;
//   submitter.Post([=] { backend->Submit(...); });
//
// Thread-safety: Post may be called from any thread. The destructor runs every task posted
// before it, then joins; a task must not destroy its TaskThread.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "common/mutex.h"

namespace tandem {

class TaskThread {
 public:
  TaskThread();
  ~TaskThread();
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  void Post(std::function<void()> task) TANDEM_EXCLUDES(mu_);

 private:
  void Loop() TANDEM_EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ TANDEM_GUARDED_BY(mu_);
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace tandem
