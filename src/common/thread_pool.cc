#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace tandem {

namespace {
// Busy-wait budget before sleeping: about 10-50 us of pause instructions. Long enough to bridge
// the gaps between the parallel calls of one decode step; short enough that an oversubscribed
// machine (another busy process, more threads than cores) falls back to sleeping quickly.
constexpr int kSpinIterations = 2000;
// How long the caller of RunOnAll spins for its helpers to finish before sleeping. Longer than a
// helper's budget: the caller goes on at once when they are done, and sleeping costs it a
// futex wake-up (tens of microseconds in a VM) at the end of every parallel call whose shares
// finish unevenly (decode attention: 3 KV heads on 2 threads). Measured: decode batch 1 at a
// 512-1,024-token context, 2 threads, 1.2-1.3x over the helpers' budget (docs/benchmarks.md).
constexpr std::chrono::microseconds kCallerSpinTime{250};
inline void CpuRelax() { __builtin_ia32_pause(); }
}  // namespace

ThreadPool::ThreadPool(int num_threads, int max_threads)
    : max_threads_(std::clamp(max_threads, 1, (1 << kThreadBits) - 1)),
      active_(std::clamp(num_threads, 1, max_threads_)) {
  for (int i = 1; i < max_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_.store(true);
  }
  start_cv_.NotifyAll();
  park_cv_.NotifyAll();
  for (auto& t : workers_) t.join();
}

int ThreadPool::SetActiveThreads(int n) {
  n = std::clamp(n, 1, max_threads_);
  {
    // Under the lock: a helper between its predicate check and its sleep cannot miss it.
    MutexLock lock(&mu_);
    active_.store(n);
  }
  park_cv_.NotifyAll();   // helpers now active wake
  start_cv_.NotifyAll();  // helpers now inactive go and park
  return n;
}

void ThreadPool::WorkerLoop(int index) {
  // Jobs are published one at a time and the caller waits for every participant, so a helper
  // looks only at the newest word: a job it takes part in cannot be followed by another before
  // it has run it.
  uint64_t seen = 0;  // the word the pool starts with (no job yet)
  while (true) {
    if (index >= active_.load()) {
      MutexLock lock(&mu_);
      park_cv_.Wait(&mu_, [&] { return stop_.load() || index < active_.load(); });
      if (stop_.load()) return;
    }
    uint64_t word = job_word_.load(std::memory_order_acquire);
    for (int spin = 0; word == seen && spin < kSpinIterations; ++spin) {
      CpuRelax();
      word = job_word_.load(std::memory_order_acquire);
    }
    if (word == seen) {
      MutexLock lock(&mu_);
      start_cv_.Wait(&mu_, [&] {
        return stop_.load() || job_word_.load() != seen || index >= active_.load();
      });
      word = job_word_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    if (word == seen) continue;  // made inactive: park
    seen = word;
    if (index >= JobThreads(word)) continue;  // a job published while this helper was parked
    (*job_)(index);
    // seq_cst pairs with the caller's store of caller_sleeping_: either we see the caller asleep
    // and wake it, or the caller sees pending_ == 0 before sleeping.
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      MutexLock lock(&mu_);
      done_cv_.NotifyOne();
    }
  }
}

void ThreadPool::RunOnAll(const std::function<void(int)>& fn) {
  const int threads = active_.load(std::memory_order_relaxed);
  if (threads == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(threads - 1, std::memory_order_relaxed);
  {
    // Under the lock so that a worker between its predicate check and its sleep cannot miss
    // the bump.
    MutexLock lock(&mu_);
    const uint64_t generation = (job_word_.load(std::memory_order_relaxed) >> kThreadBits) + 1;
    job_word_.store(JobWord(generation, threads), std::memory_order_release);
  }
  start_cv_.NotifyAll();
  fn(0);
  const auto deadline = std::chrono::steady_clock::now() + kCallerSpinTime;
  for (int spin = 1;; ++spin) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    CpuRelax();
    if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
  }
  MutexLock lock(&mu_);
  caller_sleeping_.store(true);
  done_cv_.Wait(&mu_, [&] { return pending_.load() == 0; });
  caller_sleeping_.store(false);
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                             int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = static_cast<int>(std::min<int64_t>(num_threads(), units));
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  RunOnAll([&](int t) {
    if (t >= parts) return;
    const int64_t begin = std::min(n, (units * t / parts) * grain);
    const int64_t end = std::min(n, (units * (t + 1) / parts) * grain);
    if (begin < end) fn(begin, end, t);
  });
}

}  // namespace tandem
