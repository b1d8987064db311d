// Test-only GenerationBackend: one loop thread that "generates" scripted tokens for every
// running request in round-robin steps, honouring max_tokens, end-of-generation tokens,
// cancellation (OnToken false), deadlines, a waiting-queue limit and Drain.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "serving/backend.h"

namespace tandem::server::testing {

class FakeBackend : public serving::GenerationBackend {
 public:
  // script: the tokens to emit for a request (ending with an end-of-generation token or not).
  // eog: tokens that finish a request with kStop after being emitted (unless ignore_eos).
  FakeBackend(std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script,
              std::vector<int32_t> eog, std::chrono::microseconds step = std::chrono::microseconds(500),
              int max_running = 64, int max_waiting = 64);
  ~FakeBackend() override;

  Status Submit(serving::GenerationRequest request,
                         std::shared_ptr<serving::GenerationSink> sink) override;
  serving::BackendStats Stats() const override;
  void Drain(serving::Clock::time_point deadline) override;

  // The next Submit returns this instead of queuing (once).
  void FailNextSubmit(Status st);
  // Pauses / resumes the loop (requests queue up while paused).
  void SetPaused(bool paused);
  int64_t finished(serving::FinishReason r) const;
  int active() const;  // running + waiting
  // The last request submitted (copy).
  serving::GenerationRequest last_request() const;

 private:
  struct Seq {
    serving::GenerationRequest request;
    std::shared_ptr<serving::GenerationSink> sink;
    std::vector<int32_t> script;
    size_t next = 0;
    serving::Clock::time_point first_token{};
  };
  void Loop();
  void Finish(Seq& s, serving::FinishReason reason);

  const std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script_;
  const std::vector<int32_t> eog_;
  const std::chrono::microseconds step_;
  const int max_running_;
  const int max_waiting_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Seq> waiting_;
  std::list<Seq> running_;
  bool stop_ = false;
  bool draining_ = false;
  bool paused_ = false;
  bool stop_draining_deadline_passed_ = false;  // Drain's deadline passed: cancel the rest
  std::optional<Status> fail_next_;
  serving::GenerationRequest last_request_;
  int64_t finished_[5] = {};
  int64_t generated_ = 0;
  int in_step_ = 0;         // sequences taken out of running_ for the current step
  int step_kv_blocks_ = 0;  // their blocks
  std::thread thread_;
};

}  // namespace tandem::server::testing
