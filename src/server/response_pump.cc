#include "server/response_pump.h"

#include <atomic>

#include "server/openai_response.h"

namespace tandem::server {
namespace {

// A stream's events waiting to be written beyond which it stops taking output.
constexpr size_t kMaxBacklogBytes = 256 << 10;

class ResponsePump : public std::enable_shared_from_this<ResponsePump> {
 public:
  ResponsePump(std::shared_ptr<ChoiceSet> choices, std::shared_ptr<http_door::Exchange> exchange,
               PumpOptions options)
      : choices_(std::move(choices)),
        exchange_(std::move(exchange)),
        options_(std::move(options)) {}

  void Start(std::shared_ptr<void> keep) {
    exchange_->Hold(shared_from_this());
    exchange_->Hold(std::move(keep));
    std::weak_ptr<ResponsePump> weak = weak_from_this();
    auto ring = [weak] {
      if (auto self = weak.lock()) self->Ring();
    };
    // Streams: rung when the backlog is written out; any answer: when the client goes away.
    exchange_->OnWritable(ring);
    if (options_.stream) {
      // The head goes out before anything can ring a step that writes.
      http_door::Response head{200, "text/event-stream", "", options_.headers};
      head.SetHeader("Cache-Control", "no-cache");
      head.SetHeader("X-Accel-Buffering", "no");
      exchange_->BeginStream(std::move(head));
    }
    choices_->doorbell()->SetListener(ring);
    Ring();  // what came before the listener, and the role chunks of a stream
    exchange_->Schedule(
        [weak] {
          if (auto self = weak.lock()) self->Step();
        },
        options_.give_up);
  }

 private:
  // Any thread: a step on the event loop, unless one is already waiting to run.
  void Ring() {
    if (scheduled_.exchange(true)) return;
    exchange_->Schedule([self = shared_from_this()] {
      self->scheduled_.store(false);
      self->Step();
    });
  }

  // On the exchange's strand.
  void Step() {
    if (done_) return;
    if (options_.submit_forks) {
      std::vector<size_t> due = choices_->TakeDueForks();
      if (!due.empty()) options_.submit_forks(std::move(due));
    }
    if (options_.stream) {
      StreamStep();
    } else {
      WholeStep();
    }
  }

  void StreamStep() {
    if (exchange_->gone()) {
      choices_->CancelAll();
      done_ = true;
      return;
    }
    if (exchange_->backlog_bytes() > kMaxBacklogBytes) return;  // OnWritable rings again
    bool finished = false;
    const bool sent =
        choices_->StreamStep([this](const std::string& event) { return exchange_->Write(event); },
                             options_.timeout_s, options_.give_up, &finished);
    if (!sent) {
      choices_->CancelAll();
      done_ = true;
      return;
    }
    if (finished) {
      exchange_->End();
      done_ = true;
    }
  }

  void WholeStep() {
    if (exchange_->gone()) {  // the client closed its connection: stop generating
      choices_->CancelAll();
      done_ = true;
      return;
    }
    std::optional<ChoiceSet::Whole> whole =
        choices_->TryCollectWhole(options_.give_up, options_.timeout_s);
    if (!whole) return;
    done_ = true;
    http_door::Response res{200, "application/json", std::move(whole->body), options_.headers};
    if (whole->error) {
      choices_->CancelAll();
      res.status = whole->error->status;
      res.body = ApiErrorJson(*whole->error);
    }
    exchange_->Respond(std::move(res));
  }

  std::shared_ptr<ChoiceSet> choices_;
  std::shared_ptr<http_door::Exchange> exchange_;
  const PumpOptions options_;
  std::atomic<bool> scheduled_{false};
  bool done_ = false;  // on the strand only
};

}  // namespace

void StartResponsePump(std::shared_ptr<ChoiceSet> choices,
                       std::shared_ptr<http_door::Exchange> exchange, PumpOptions options,
                       std::shared_ptr<void> keep) {
  std::make_shared<ResponsePump>(std::move(choices), std::move(exchange), std::move(options))
      ->Start(std::move(keep));
}

}  // namespace tandem::server
