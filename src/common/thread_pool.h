// A fixed pool of worker threads for data-parallel loops.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(n_rows, [&](int64_t begin, int64_t end, int thread) { ... });
//
// Thread-safety: ParallelFor may be called from one thread at a time (the engine loop). The
// calling thread takes part in the work, so a pool of N threads starts N-1 helpers.
//
// Hand-off cost matters: a decode step makes a few hundred parallel calls of tens of
// microseconds each. Workers therefore spin for a short while on the job counter before sleeping
// on a condition variable, and the caller spins briefly on the completion count before sleeping
// too, so that an oversubscribed machine degrades gracefully instead of burning time slices.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace tandem {

class ThreadPool {
 public:
  // num_threads >= 1, counting the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into num_threads() contiguous ranges of near-equal size (a multiple of
  // `grain`, except the last) and runs fn(begin, end, thread_index) on each; returns when all
  // are done. Empty ranges are skipped.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                   int64_t grain = 1);

  // Runs fn(thread_index) once on every thread (0 = the caller) and waits.
  void RunOnAll(const std::function<void(int)>& fn) TANDEM_EXCLUDES(mu_);

 private:
  void WorkerLoop(int index) TANDEM_EXCLUDES(mu_);

  const int num_threads_;
  std::vector<std::thread> workers_;
  // Only for sleeping and waking without lost wake-ups: it guards no member (the job state below
  // is atomic, or published through generation_), so nothing is TANDEM_GUARDED_BY it.
  Mutex mu_;
  CondVar start_cv_;
  CondVar done_cv_;  // the caller sleeps here after spinning
  std::atomic<bool> caller_sleeping_{false};
  // Published with release order before generation_ is bumped; read after acquiring it.
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // bumped once per job
  std::atomic<int> pending_{0};          // helpers still running the current job
  std::atomic<bool> stop_{false};
};

}  // namespace tandem
