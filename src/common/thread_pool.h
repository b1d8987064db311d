// A fixed pool of worker threads for data-parallel loops.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(n_rows, [&](int64_t begin, int64_t end, int thread) { ... });
//
// Thread-safety: ParallelFor may be called from one thread at a time (the engine loop). The
// calling thread takes part in the work, so a pool of N threads starts N-1 helpers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
  void RunOnAll(const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                        // guarded by mu_
  int pending_ = 0;                                // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
};

}  // namespace tandem
