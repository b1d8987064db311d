// Test-only GenerationBackend: one loop thread that "generates" scripted tokens for every
// running request in round-robin steps, honouring max_tokens, end-of-generation tokens,
// cancellation (OnToken false), deadlines, a waiting-queue limit and Drain.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "serving/backend.h"

namespace tandem::server::testing {

class FakeBackend : public serving::GenerationBackend {
 public:
  // script: the tokens to emit for a request (ending with an end-of-generation token or not).
  // eog: tokens that finish a request with kStop after being emitted (unless ignore_eos).
  FakeBackend(std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script,
              std::vector<int32_t> eog,
              std::chrono::microseconds step = std::chrono::microseconds(500), int max_running = 64,
              int max_waiting = 64);
  ~FakeBackend() override;

  Status Submit(serving::GenerationRequest request,
                std::shared_ptr<serving::GenerationSink> sink) override TANDEM_EXCLUDES(mu_);
  serving::BackendStats Stats() const override TANDEM_EXCLUDES(mu_);
  void Drain(serving::Clock::time_point deadline) override TANDEM_EXCLUDES(mu_);

  // The next Submit returns this instead of queuing (once).
  void FailNextSubmit(Status st) TANDEM_EXCLUDES(mu_);
  // Pauses / resumes the loop (requests queue up while paused).
  void SetPaused(bool paused) TANDEM_EXCLUDES(mu_);
  int64_t finished(serving::FinishReason r) const TANDEM_EXCLUDES(mu_);
  int active() const TANDEM_EXCLUDES(mu_);  // running + waiting
  // The last request submitted (copy).
  serving::GenerationRequest last_request() const TANDEM_EXCLUDES(mu_);

 private:
  struct Seq {
    serving::GenerationRequest request;
    std::shared_ptr<serving::GenerationSink> sink;
    std::vector<int32_t> script;
    size_t next = 0;
    serving::Clock::time_point first_token{};
  };
  void Loop() TANDEM_EXCLUDES(mu_);
  void Finish(Seq& s, serving::FinishReason reason) TANDEM_EXCLUDES(mu_);

  const std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script_;
  const std::vector<int32_t> eog_;
  const std::chrono::microseconds step_;
  const int max_running_;
  const int max_waiting_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Seq> waiting_ TANDEM_GUARDED_BY(mu_);
  std::list<Seq> running_ TANDEM_GUARDED_BY(mu_);
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  bool draining_ TANDEM_GUARDED_BY(mu_) = false;
  bool paused_ TANDEM_GUARDED_BY(mu_) = false;
  // Drain's deadline passed: cancel the rest.
  bool stop_draining_deadline_passed_ TANDEM_GUARDED_BY(mu_) = false;
  std::optional<Status> fail_next_ TANDEM_GUARDED_BY(mu_);
  serving::GenerationRequest last_request_ TANDEM_GUARDED_BY(mu_);
  int64_t finished_[5] TANDEM_GUARDED_BY(mu_) = {};
  int64_t generated_ TANDEM_GUARDED_BY(mu_) = 0;
  int in_step_ TANDEM_GUARDED_BY(mu_) = 0;  // sequences taken out of running_ for the current step
  int step_kv_blocks_ TANDEM_GUARDED_BY(mu_) = 0;  // their blocks
  std::thread thread_;
};

}  // namespace tandem::server::testing
