// A fixed pool of worker threads for data-parallel loops.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(n_rows, [&](int64_t begin, int64_t end, int thread) { ... });
//
// Thread-safety: ParallelFor, RunOnAll and SetActiveThreads may be called from one thread at a
// time (the engine loop). The calling thread takes part in the work, so a pool of N threads
// starts N-1 helpers.
//
// Resizing: the pool starts max_threads threads and computes on the first num_threads() of
// them; SetActiveThreads changes that between calls (elastic pools move cores between workers
// without restarting them). Helpers beyond the active count sleep on their own condition
// variable and wake for nothing but a resize or the pool's end, so an inactive thread costs no
// CPU time.
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
  // num_threads >= 1, counting the caller; all of them active.
  explicit ThreadPool(int num_threads) : ThreadPool(num_threads, num_threads) {}
  // max_threads threads started, the first num_threads active (num_threads clamped to
  // [1, max_threads]).
  ThreadPool(int num_threads, int max_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads the next ParallelFor / RunOnAll uses (counting the caller).
  int num_threads() const { return active_.load(std::memory_order_relaxed); }
  int max_threads() const { return max_threads_; }
  // Sets num_threads() to n clamped to [1, max_threads()]; returns the count set. Between
  // parallel calls only (the caller's thread).
  int SetActiveThreads(int n) TANDEM_EXCLUDES(mu_);

  // Splits [0, n) into num_threads() contiguous ranges of near-equal size (a multiple of
  // `grain`, except the last) and runs fn(begin, end, thread_index) on each; returns when all
  // are done. Empty ranges are skipped.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                   int64_t grain = 1);

  // Runs fn(thread_index) once on every thread (0 = the caller) and waits.
  void RunOnAll(const std::function<void(int)>& fn) TANDEM_EXCLUDES(mu_);

 private:
  void WorkerLoop(int index) TANDEM_EXCLUDES(mu_);

  // The job word: generation << kThreadBits | threads taking part. One atomic, so a helper
  // reads a job's generation and its participants together.
  static constexpr int kThreadBits = 16;
  static uint64_t JobWord(uint64_t generation, int threads) {
    return generation << kThreadBits | static_cast<uint64_t>(threads);
  }
  static int JobThreads(uint64_t word) {
    return static_cast<int>(word & ((1u << kThreadBits) - 1));
  }

  const int max_threads_;
  std::atomic<int> active_;  // written by the caller's thread between jobs
  std::vector<std::thread> workers_;
  // Only for sleeping and waking without lost wake-ups: it guards no member (the job state below
  // is atomic, or published through job_word_), so nothing is TANDEM_GUARDED_BY it.
  Mutex mu_;
  CondVar start_cv_;
  CondVar done_cv_;  // the caller sleeps here after spinning
  CondVar park_cv_;  // helpers beyond the active count sleep here
  std::atomic<bool> caller_sleeping_{false};
  // Published with release order before job_word_ is bumped; read after acquiring it.
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> job_word_{0};  // JobWord: the generation bumped once per job
  std::atomic<int> pending_{0};        // helpers still running the current job
  std::atomic<bool> stop_{false};
};

}  // namespace tandem
