#include "server/request_sink.h"

#include <algorithm>

namespace tandem::server {

RequestSink::RequestSink(const model::Tokenizer* tokenizer, std::vector<std::string> stops,
                         bool ignore_eos, std::function<void(const serving::FinishInfo&)> on_finish,
                         Extras extras)
    : tokenizer_(tokenizer),
      decoder_(tokenizer),
      stop_(std::move(stops)),
      ignore_eos_(ignore_eos),
      on_finish_(std::move(on_finish)),
      extras_(std::move(extras)) {}

void Doorbell::Ring() {
  std::function<void()> listener;
  {
    MutexLock lock(&mu_);
    ++rings_;
    listener = listener_;
  }
  if (listener) listener();
}

uint64_t Doorbell::rings() const {
  MutexLock lock(&mu_);
  return rings_;
}

void Doorbell::SetListener(std::function<void()> listener) {
  MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void RequestSink::Notify() {
  cv_.NotifyAll();
  if (extras_.doorbell) extras_.doorbell->Ring();
}

bool RequestSink::Started() const {
  MutexLock lock(&mu_);
  return started_;
}

void RequestSink::OnPromptLogprobs(std::vector<engine::SampledToken> tokens) {
  std::vector<TokenLogprobs> out;
  out.reserve(tokens.size() + 1);
  out.push_back({tokenizer_->TokenToPiece(extras_.first_prompt_token), std::nullopt, {}});
  for (const engine::SampledToken& t : tokens) {
    TokenLogprobs entry{tokenizer_->TokenToPiece(t.token), t.logprob, {}};
    for (const auto& alt : t.top)
      entry.top.emplace_back(tokenizer_->TokenToPiece(alt.token), alt.logprob);
    out.push_back(std::move(entry));
  }
  {
    MutexLock lock(&mu_);
    pending_prompt_logprobs_ = std::move(out);
  }
  Notify();
}

bool RequestSink::OnToken(const engine::SampledToken& sampled) {
  const int32_t token = sampled.token;
  bool first = false;
  {
    MutexLock lock(&mu_);
    if (client_gone_) return false;
    first = !started_;
    started_ = true;
  }
  if (first) Notify();
  if (stop_.stopped()) return false;
  if (extras_.logprobs) {
    TokenLogprobs entry{tokenizer_->TokenToPiece(token), sampled.logprob, {}};
    entry.top.reserve(sampled.top.size());
    for (const auto& alt : sampled.top) {
      entry.top.emplace_back(tokenizer_->TokenToPiece(alt.token), alt.logprob);
    }
    {
      MutexLock lock(&mu_);
      pending_logprobs_.push_back(std::move(entry));
    }
    Notify();
  }
  // End-of-generation and stop tokens end the text; the backend finishes the request after them.
  const auto& ids = extras_.stop_token_ids;
  if ((!ignore_eos_ && tokenizer_->IsEndOfGeneration(token)) ||
      std::find(ids.begin(), ids.end(), token) != ids.end()) {
    return true;
  }
  StopMatcher::Result r = stop_.Push(decoder_.Push(token));
  if (!r.text.empty()) {
    MutexLock lock(&mu_);
    pending_ += r.text;
  }
  if (!r.text.empty() || r.stopped) Notify();
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
    started_ = true;
    info_ = final_info;
  }
  Notify();
}

RequestSink::Taken RequestSink::Wait(std::chrono::steady_clock::duration timeout) {
  Taken t;
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, timeout, [&] {
    mu_.AssertHeld();
    return !pending_.empty() || !pending_logprobs_.empty() || pending_prompt_logprobs_ || finished_;
  });
  t.prompt_logprobs = std::move(pending_prompt_logprobs_);
  pending_prompt_logprobs_.reset();
  t.text = std::move(pending_);
  pending_.clear();
  t.logprobs = std::move(pending_logprobs_);
  pending_logprobs_.clear();
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
