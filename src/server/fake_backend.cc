#include "server/fake_backend.h"

#include <algorithm>

namespace tandem::server::testing {

using serving::Clock;
using serving::FinishReason;

FakeBackend::FakeBackend(
    std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script,
    std::vector<int32_t> eog, std::chrono::microseconds step, int max_running, int max_waiting)
    : script_(std::move(script)),
      eog_(std::move(eog)),
      step_(step),
      max_running_(max_running),
      max_waiting_(max_waiting),
      thread_([this] { Loop(); }) {}

FakeBackend::~FakeBackend() {
  Drain(Clock::now());
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

Status FakeBackend::Submit(serving::GenerationRequest request,
                           std::shared_ptr<serving::GenerationSink> sink) {
  MutexLock lock(&mu_);
  if (fail_next_) {
    Status st = *fail_next_;
    fail_next_.reset();
    return st;
  }
  if (draining_) return FailedPrecondition("draining");
  if (static_cast<int>(waiting_.size()) >= max_waiting_)
    return ResourceExhausted("waiting queue full");
  if (request.prompt_tokens.empty()) return InvalidArgument("empty prompt");
  last_request_ = request;
  Seq s;
  s.script = script_(request);
  s.request = std::move(request);
  s.sink = std::move(sink);
  waiting_.push_back(std::move(s));
  cv_.NotifyAll();
  return OkStatus();
}

serving::BackendStats FakeBackend::Stats() const {
  MutexLock lock(&mu_);
  serving::BackendStats st;
  st.running = static_cast<int>(running_.size()) + in_step_;
  st.waiting = static_cast<int>(waiting_.size());
  st.kv_blocks_total = 1000;
  for (const Seq& s : running_) {
    st.kv_blocks_used += static_cast<int>((s.request.prompt_tokens.size() + s.next + 15) / 16);
  }
  st.kv_blocks_used += step_kv_blocks_;
  st.generated_tokens = generated_;
  return st;
}

void FakeBackend::Drain(Clock::time_point deadline) {
  MutexLock lock(&mu_);
  draining_ = true;
  paused_ = false;
  cv_.NotifyAll();
  const auto all_done = [&] {
    mu_.AssertHeld();
    return running_.empty() && waiting_.empty() && in_step_ == 0;
  };
  cv_.WaitUntil(&mu_, deadline, all_done);
  // Past the deadline: the loop finishes what is left as cancelled.
  stop_draining_deadline_passed_ = true;
  cv_.NotifyAll();
  cv_.Wait(&mu_, all_done);
}

void FakeBackend::FailNextSubmit(Status st) {
  MutexLock lock(&mu_);
  fail_next_ = std::move(st);
}

void FakeBackend::SetPaused(bool paused) {
  MutexLock lock(&mu_);
  paused_ = paused;
  cv_.NotifyAll();
}

int64_t FakeBackend::finished(FinishReason r) const {
  MutexLock lock(&mu_);
  return finished_[static_cast<int>(r)];
}

int FakeBackend::active() const {
  MutexLock lock(&mu_);
  return static_cast<int>(running_.size() + waiting_.size()) + in_step_;
}

serving::GenerationRequest FakeBackend::last_request() const {
  MutexLock lock(&mu_);
  return last_request_;
}

// Called with mu_ unlocked for the sink call; counts under the lock.
void FakeBackend::Finish(Seq& s, FinishReason reason) {
  serving::FinishInfo info;
  info.reason = reason;
  info.prompt_tokens = static_cast<int>(s.request.prompt_tokens.size());
  info.completion_tokens = static_cast<int>(s.next);
  const Clock::time_point now = Clock::now();
  info.total_seconds = std::chrono::duration<double>(now - s.request.arrival).count();
  info.ttft_seconds =
      s.next > 0 ? std::chrono::duration<double>(s.first_token - s.request.arrival).count() : 0;
  s.sink->OnFinish(info);
  MutexLock lock(&mu_);
  ++finished_[static_cast<int>(reason)];
}

void FakeBackend::Loop() {
  MutexLock lock(&mu_);  // released around the sink calls below
  while (true) {
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return stop_ || stop_draining_deadline_passed_ ||
             (!paused_ && (!running_.empty() || !waiting_.empty()));
    });
    if (stop_) return;
    const bool cancel_all = stop_draining_deadline_passed_;
    while (!waiting_.empty() && static_cast<int>(running_.size()) < max_running_) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    if (cancel_all) {
      std::list<Seq> all = std::move(running_);
      running_.clear();
      for (auto& s : waiting_) all.push_back(std::move(s));
      waiting_.clear();
      in_step_ = static_cast<int>(all.size());
      mu_.Unlock();
      for (Seq& s : all) Finish(s, FinishReason::kCancelled);
      mu_.Lock();
      in_step_ = 0;
      stop_draining_deadline_passed_ = false;
      cv_.NotifyAll();
      continue;
    }
    // One step: one token for every running sequence, sinks called without the lock held.
    std::list<Seq> step = std::move(running_);
    running_.clear();
    in_step_ = static_cast<int>(step.size());
    step_kv_blocks_ = 0;
    for (const Seq& s : step)
      step_kv_blocks_ += static_cast<int>((s.request.prompt_tokens.size() + s.next + 15) / 16);
    mu_.Unlock();
    std::list<Seq> keep;
    for (Seq& s : step) {
      const Clock::time_point now = Clock::now();
      if (now > s.request.deadline) {
        Finish(s, FinishReason::kTimeout);
        continue;
      }
      if (s.next >= s.script.size() || static_cast<int>(s.next) >= s.request.max_tokens) {
        Finish(s, FinishReason::kLength);
        continue;
      }
      const int32_t token = s.script[s.next++];
      if (s.next == 1) s.first_token = now;
      {
        MutexLock g(&mu_);
        ++generated_;
      }
      if (!s.sink->OnToken(engine::SampledToken{token})) {
        Finish(s, FinishReason::kCancelled);
        continue;
      }
      const bool eog = std::find(eog_.begin(), eog_.end(), token) != eog_.end();
      if (serving::EndsGeneration(s.request, token, eog)) {
        Finish(s, FinishReason::kStop);
        continue;
      }
      if (static_cast<int>(s.next) >= s.request.max_tokens) {
        Finish(s, FinishReason::kLength);
        continue;
      }
      keep.push_back(std::move(s));
    }
    std::this_thread::sleep_for(step_);
    mu_.Lock();
    running_ = std::move(keep);
    in_step_ = 0;
    step_kv_blocks_ = 0;
    cv_.NotifyAll();
  }
}

}  // namespace tandem::server::testing
