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
#include <string>
#include <vector>

#include "common/mutex.h"
#include "model/tokenizer.h"
#include "server/stop_matcher.h"
#include "serving/backend.h"

namespace tandem::server {

class RequestSink : public serving::GenerationSink {
 public:
  // on_finish (may be null) runs once on the backend's thread when the final info is known and
  // before Wait() reports the end (metrics, the request log line); it must not block.
  RequestSink(const model::Tokenizer* tokenizer, std::vector<std::string> stops, bool ignore_eos,
              std::function<void(const serving::FinishInfo&)> on_finish);

  // Backend side.
  bool OnToken(int32_t token) override TANDEM_EXCLUDES(mu_);
  void OnFinish(const serving::FinishInfo& info) override TANDEM_EXCLUDES(mu_);

  // HTTP side. Waits until text is pending, the request finished, or `timeout` passed; takes
  // all pending text. `finished` is true once the request ended and no text is left, and `info`
  // is then the final FinishInfo (reason kStop when a stop string matched).
  struct Taken {
    std::string text;
    bool finished = false;
    serving::FinishInfo info;
  };
  Taken Wait(std::chrono::steady_clock::duration timeout) TANDEM_EXCLUDES(mu_);
  // The client went away (write failed, timed out): the next OnToken cancels the request.
  void MarkClientGone() TANDEM_EXCLUDES(mu_);
  bool client_gone() const TANDEM_EXCLUDES(mu_);

 private:
  // Backend-thread state (touched only by OnToken/OnFinish, never concurrently): no lock.
  const model::Tokenizer* tokenizer_;
  model::StreamDecoder decoder_;
  StopMatcher stop_;
  const bool ignore_eos_;
  std::function<void(const serving::FinishInfo&)> on_finish_;

  // Shared state.
  mutable Mutex mu_;
  CondVar cv_;
  std::string pending_ TANDEM_GUARDED_BY(mu_);
  bool finished_ TANDEM_GUARDED_BY(mu_) = false;
  bool client_gone_ TANDEM_GUARDED_BY(mu_) = false;
  serving::FinishInfo info_ TANDEM_GUARDED_BY(mu_);
};

}  // namespace tandem::server
