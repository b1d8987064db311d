// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with the lock
// annotations of common/thread_annotations.h, so that clang checks every TANDEM_GUARDED_BY
// member is touched only under its mutex. Same cost as the std types (thin inline wrappers).
//
//   MutexLock lock(&mu_);
//   while (items_.empty()) cv_.Wait(&mu_);
//   if (!cv_.WaitUntil(&mu_, deadline, [&] { return done_; })) return DeadlineExceeded("...");
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace tandem {

class TANDEM_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() TANDEM_ACQUIRE() { mu_.lock(); }
  void Unlock() TANDEM_RELEASE() { mu_.unlock(); }
  bool TryLock() TANDEM_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds the lock (where it cannot see it, e.g. callbacks).
  void AssertHeld() const TANDEM_ASSERT_HELD(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class TANDEM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TANDEM_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() TANDEM_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable waited on with a held Mutex (released while waiting, held on return).
class CondVar {
 public:
  void Wait(Mutex* mu) TANDEM_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate done) TANDEM_REQUIRES(mu) {
    while (!done()) Wait(mu);
  }
  // False when the deadline passed first (std::cv_status::timeout).
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline)
      TANDEM_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // The predicate's value when it became true or the deadline passed.
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate done) TANDEM_REQUIRES(mu) {
    while (!done()) {
      if (!WaitUntil(mu, deadline)) return done();
    }
    return true;
  }
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout, Predicate done)
      TANDEM_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, std::move(done));
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tandem
