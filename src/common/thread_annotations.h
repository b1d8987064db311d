// Lock annotations checked by clang's -Wthread-safety (the `thread-safety` preset and
// scripts/check_thread_safety.sh); empty under other compilers. Use them with tandem::Mutex
// (common/mutex.h): libstdc++'s std::mutex carries no annotations, so clang cannot see it.
//
//   class Queue {
//     void Push(int v) TANDEM_EXCLUDES(mu_);
//     void PushLocked(int v) TANDEM_REQUIRES(mu_);
//     Mutex mu_;
//     std::deque<int> items_ TANDEM_GUARDED_BY(mu_);
//   };
#pragma once

#if defined(__clang__)
#define TANDEM_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TANDEM_THREAD_ANNOTATION(x)
#endif

#define TANDEM_CAPABILITY(x) TANDEM_THREAD_ANNOTATION(capability(x))
#define TANDEM_SCOPED_CAPABILITY TANDEM_THREAD_ANNOTATION(scoped_lockable)
#define TANDEM_GUARDED_BY(x) TANDEM_THREAD_ANNOTATION(guarded_by(x))
#define TANDEM_PT_GUARDED_BY(x) TANDEM_THREAD_ANNOTATION(pt_guarded_by(x))
#define TANDEM_REQUIRES(...) TANDEM_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TANDEM_EXCLUDES(...) TANDEM_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TANDEM_ACQUIRE(...) TANDEM_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TANDEM_RELEASE(...) TANDEM_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TANDEM_TRY_ACQUIRE(...) TANDEM_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TANDEM_ASSERT_HELD(x) TANDEM_THREAD_ANNOTATION(assert_capability(x))
#define TANDEM_NO_THREAD_SAFETY_ANALYSIS TANDEM_THREAD_ANNOTATION(no_thread_safety_analysis)
