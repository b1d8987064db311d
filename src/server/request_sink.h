// The GenerationSink of one HTTP request: it turns tokens into text on the backend's thread
// (model::StreamDecoder, then StopMatcher so that stop strings are never emitted) and queues the
// text for the HTTP thread, which takes it with Wait(). The backend's thread never blocks on the
// client: text accumulates in `pending_` however slow the client reads.
//
// Lifetime: shared by the backend (until OnFinish returns) and the HTTP handler / streaming
// content provider. The tokenizer must outlive it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "model/tokenizer.h"
#include "server/openai_response.h"
#include "server/stop_matcher.h"
#include "serving/backend.h"

namespace tandem::server {

// Rung when any of a response's sinks has news; calls its listener (the response's pump,
// which then takes the news on the event loop). Thread-safe.
class Doorbell {
 public:
  void Ring() TANDEM_EXCLUDES(mu_);
  uint64_t rings() const TANDEM_EXCLUDES(mu_);
  // `listener` runs on the ringing thread (a backend thread) at each ring from now on; it must
  // be quick and must not block.
  void SetListener(std::function<void()> listener) TANDEM_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  uint64_t rings_ TANDEM_GUARDED_BY(mu_) = 0;
  std::function<void()> listener_ TANDEM_GUARDED_BY(mu_);
};

// What a RequestSink does beyond text and stop strings.
struct RequestSinkExtras {
  // Tokens that end the generation like end-of-generation tokens: their text is not shown.
  std::vector<int32_t> stop_token_ids;
  // Collect every token's logprobs (as the backend reports them) for Wait() to hand out.
  bool logprobs = false;
  // Rung whenever Wait() would return something new (may be null).
  std::shared_ptr<Doorbell> doorbell;
  // With prompt logprobs: the prompt's first token (it has no logprob; the rest come from the
  // backend).
  int32_t first_prompt_token = -1;
};

class RequestSink : public serving::GenerationSink {
 public:
  using Extras = RequestSinkExtras;
  // on_finish (may be null) runs once on the backend's thread when the final info is known and
  // before Wait() reports the end (metrics, the request log line); it must not block.
  RequestSink(const model::Tokenizer* tokenizer, std::vector<std::string> stops, bool ignore_eos,
              std::function<void(const serving::FinishInfo&)> on_finish, Extras extras = {});

  // Backend side.
  bool OnToken(const engine::SampledToken& token) override TANDEM_EXCLUDES(mu_);
  void OnPromptLogprobs(std::vector<engine::SampledToken> tokens) override TANDEM_EXCLUDES(mu_);
  void OnFinish(const serving::FinishInfo& info) override TANDEM_EXCLUDES(mu_);

  // HTTP side. Waits until text is pending, the request finished, or `timeout` passed; takes
  // all pending text. `finished` is true once the request ended and no text is left, and `info`
  // is then the final FinishInfo (reason kStop when a stop string matched). `logprobs` holds
  // the tokens seen since the last Wait (with Extras::logprobs), end tokens included; they may
  // run ahead of `text`, which holds back what could start a stop string.
  struct Taken {
    std::string text;
    std::vector<TokenLogprobs> logprobs;
    // Prompt logprobs (every prompt token, the first without a value): once, when they came.
    std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
    bool finished = false;
    serving::FinishInfo info;
  };
  Taken Wait(std::chrono::steady_clock::duration timeout) TANDEM_EXCLUDES(mu_);
  // The backend produced a token or finished the request (never blocks).
  bool Started() const TANDEM_EXCLUDES(mu_);
  // The client went away (write failed, timed out): the next OnToken cancels the request.
  void MarkClientGone() TANDEM_EXCLUDES(mu_);
  bool client_gone() const TANDEM_EXCLUDES(mu_);

 private:
  void Notify();  // wakes Wait()ers and the doorbell

  // Backend-thread state (touched only by OnToken/OnFinish, never concurrently): no lock.
  const model::Tokenizer* tokenizer_;
  model::StreamDecoder decoder_;
  StopMatcher stop_;
  const bool ignore_eos_;
  std::function<void(const serving::FinishInfo&)> on_finish_;
  const Extras extras_;

  // Shared state.
  mutable Mutex mu_;
  CondVar cv_;
  std::string pending_ TANDEM_GUARDED_BY(mu_);
  std::vector<TokenLogprobs> pending_logprobs_ TANDEM_GUARDED_BY(mu_);
  std::optional<std::vector<TokenLogprobs>> pending_prompt_logprobs_ TANDEM_GUARDED_BY(mu_);
  bool finished_ TANDEM_GUARDED_BY(mu_) = false;
  bool started_ TANDEM_GUARDED_BY(mu_) = false;  // a token came, or the end
  bool client_gone_ TANDEM_GUARDED_BY(mu_) = false;
  serving::FinishInfo info_ TANDEM_GUARDED_BY(mu_);
};

}  // namespace tandem::server
