#include "server/request_sink.h"

namespace tandem::server {

RequestSink::RequestSink(const model::Tokenizer* tokenizer, std::vector<std::string> stops,
                         bool ignore_eos, std::function<void(const serving::FinishInfo&)> on_finish)
    : tokenizer_(tokenizer),
      decoder_(tokenizer),
      stop_(std::move(stops)),
      ignore_eos_(ignore_eos),
      on_finish_(std::move(on_finish)) {}

bool RequestSink::OnToken(int32_t token) {
  {
    MutexLock lock(&mu_);
    if (client_gone_) return false;
  }
  if (stop_.stopped()) return false;
  // End-of-generation tokens end the text; the backend finishes the request after them.
  if (!ignore_eos_ && tokenizer_->IsEndOfGeneration(token)) return true;
  StopMatcher::Result r = stop_.Push(decoder_.Push(token));
  if (!r.text.empty()) {
    MutexLock lock(&mu_);
    pending_ += r.text;
  }
  if (!r.text.empty() || r.stopped) cv_.NotifyAll();
  return !r.stopped;
}

void RequestSink::OnFinish(const serving::FinishInfo& info) {
  std::string tail;
  if (!stop_.stopped()) {
    StopMatcher::Result r = stop_.Push(decoder_.Flush());
    tail = std::move(r.text);
    if (!r.stopped) tail += stop_.Flush();
  }
  serving::FinishInfo final_info = info;
  if (stop_.stopped()) final_info.reason = serving::FinishReason::kStop;
  // Before the HTTP side can see the end, so that metrics already count a finished response.
  if (on_finish_) on_finish_(final_info);
  {
    MutexLock lock(&mu_);
    pending_ += tail;
    finished_ = true;
    info_ = final_info;
  }
  cv_.NotifyAll();
}

RequestSink::Taken RequestSink::Wait(std::chrono::steady_clock::duration timeout) {
  Taken t;
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, timeout, [&] {
    mu_.AssertHeld();
    return !pending_.empty() || finished_;
  });
  t.text = std::move(pending_);
  pending_.clear();
  t.finished = finished_;
  if (finished_) t.info = info_;
  return t;
}

void RequestSink::MarkClientGone() {
  MutexLock lock(&mu_);
  client_gone_ = true;
}

bool RequestSink::client_gone() const {
  MutexLock lock(&mu_);
  return client_gone_;
}

}  // namespace tandem::server
