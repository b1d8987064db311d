// The worker's decode side (worker_impl_internal.h): a /v1/decode call reserves KV blocks for
// the prompt and streams the request's lines; the prefill side's kv_ready notification hands
// the request to the engine loop, whose tokens the stream relays.
#include <nlohmann/json.hpp>

#include "cluster/worker_impl_internal.h"
#include "common/json_numbers.h"

namespace tandem::cluster::worker_internal {

using nlohmann::json;

// The lines of one /v1/decode response, produced by the engine loop (tokens) or the hand-off
// thread, consumed by the HTTP thread that writes the stream.
class DecodeStream {
 public:
  void Push(const DecodeEvent& e) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      lines_.push_back(e.ToJson() + "\n");
      if (e.kind == DecodeEvent::Kind::kFinish || e.kind == DecodeEvent::Kind::kError) done_ = true;
    }
    cv_.NotifyAll();
  }
  // Takes the lines available, waiting up to `wait`. Sets *done when the stream is complete.
  std::vector<std::string> Take(std::chrono::milliseconds wait, bool* done) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, wait, [&] {
      mu_.AssertHeld();
      return !lines_.empty() || done_;
    });
    std::vector<std::string> out(lines_.begin(), lines_.end());
    lines_.clear();
    *done = done_;
    return out;
  }
  bool done() const TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return done_;
  }
  void MarkClientGone() { client_gone_.store(true); }
  bool client_gone() const { return client_gone_.load(); }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::string> lines_ TANDEM_GUARDED_BY(mu_);
  bool done_ TANDEM_GUARDED_BY(mu_) = false;
  std::atomic<bool> client_gone_{false};  // lock-free: set by the HTTP thread, polled by the sink
};

namespace {

// Relays a decode-side request's tokens into its stream.
class StreamSink : public serving::GenerationSink {
 public:
  StreamSink(std::shared_ptr<DecodeStream> stream, Clock::time_point kv_landed)
      : stream_(std::move(stream)), kv_landed_(kv_landed) {}
  bool OnToken(const engine::SampledToken& token) override {
    if (!first_seen_) {
      first_seen_ = true;
      first_decode_seconds_ = Seconds(Clock::now() - kv_landed_);
    }
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kToken;
    e.token = token;
    stream_->Push(e);
    return !stream_->client_gone();
  }
  void OnPromptLogprobs(std::vector<engine::SampledToken> tokens) override {
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kPromptLogprobs;
    e.prompt_logprobs = std::move(tokens);
    stream_->Push(e);
  }
  void OnFinish(const serving::FinishInfo& info) override {
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kFinish;
    e.finish = info;
    e.finish.first_decode_seconds = first_seen_ ? first_decode_seconds_ : -1;
    stream_->Push(e);
  }

 private:
  std::shared_ptr<DecodeStream> stream_;
  Clock::time_point kv_landed_;
  bool first_seen_ = false;
  double first_decode_seconds_ = -1;
};

}  // namespace

void WorkerImpl::HandleDecode(const httplib::Request& req, httplib::Response& res) {
  if (!CanDecode(role_.load())) {
    return ReplyError(res, FailedPrecondition("worker " + options_.name + " does not decode"));
  }
  auto call = DecodeCall::FromJson(req.body);
  if (!call.ok()) return ReplyError(res, call.status());
  const Clock::time_point now = Clock::now();
  serving::GenerationRequest g;
  g.id = call->id;
  g.prompt_tokens = call->prompt_tokens;
  g.max_tokens = call->max_tokens;
  g.ignore_eos = call->ignore_eos;
  g.sampling = call->sampling;
  g.resumed_output = call->resumed_output;
  g.arrival = now;
  g.deadline = now + std::chrono::milliseconds(call->timeout_ms);
  auto stream = std::make_shared<DecodeStream>();
  if (call->local) {
    if (Status st = backend_->Submit(std::move(g), std::make_shared<StreamSink>(stream, now));
        !st.ok()) {
      return ReplyError(res, st);
    }
  } else {
    const Clock::time_point kv_deadline =
        std::min(g.deadline, now + std::chrono::milliseconds(call->kv_wait_ms));
    const int n_prompt = static_cast<int>(g.prompt_tokens.size());
    // Only the blocks its prefix cache lacks are written by the prefill side.
    auto got = call->reuse_prefix
                   ? backend_->ReservePrompt(g.id, g.prompt_tokens, n_prompt + 1, kv_deadline)
                   : backend_->ReserveBlocks(g.id, n_prompt + 1, kv_deadline);
    if (!got.ok()) return ReplyError(res, got.status());
    DecodeEvent reserved;
    reserved.kind = DecodeEvent::Kind::kReserved;
    reserved.reserved.segment = segment_name_;
    reserved.reserved.blocks = std::move(got->blocks);
    reserved.reserved.skip_blocks = got->cached_blocks;
    reserved.reserved.window_blocks = std::move(got->window_blocks);
    reserved.reserved.window_arena_offset = engine_->kv().WindowArenaOffset();
    reserved.reserved.window_tokens = engine_->kv().shape().window_tokens;
    reserved.reserved.block_tokens = info_.block_tokens;
    reserved.reserved.n_layers = info_.n_layers;
    reserved.reserved.layer_slice_bytes = info_.layer_slice_bytes;
    reserved.reserved.decode_worker = options_.name;
    stream->Push(reserved);
    const std::string key = g.id;  // (the right side of `=` is evaluated first)
    MutexLock lock(&pending_mu_);
    pending_[key] = Pending{std::move(g), stream, kv_deadline};
  }
  const std::string id = call->id;
  // Counted until the response object goes (its releaser runs then, once).
  auto in_flight = std::make_shared<InFlight>(&decodes_in_flight_);
  res.set_chunked_content_provider(
      "application/x-ndjson",
      [this, stream, id](size_t, httplib::DataSink& out) {
        bool done = false;
        for (const std::string& line : stream->Take(std::chrono::milliseconds(100), &done)) {
          if (!out.write(line.data(), line.size())) {
            OnClientGone(id, *stream);
            return false;
          }
        }
        if (done) {
          out.done();
          return true;
        }
        if (out.is_writable && !out.is_writable()) {
          OnClientGone(id, *stream);
          return false;
        }
        ExpireKvWait(id);
        return true;
      },
      [this, stream, id, in_flight](bool success) {
        if (!success || !stream->done()) OnClientGone(id, *stream);
      });
}

void WorkerImpl::OnClientGone(const std::string& id, DecodeStream& stream) {
  stream.MarkClientGone();  // the sink cancels the running sequence at its next token
  CancelPending(id, Cancelled("the conductor went away"));
}

void WorkerImpl::CancelPending(const std::string& id, const Status& why) {
  std::shared_ptr<DecodeStream> stream;
  {
    MutexLock lock(&pending_mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    stream = it->second.stream;
    pending_.erase(it);
  }
  backend_->CancelReservation(id);
  DecodeEvent e;
  e.kind = DecodeEvent::Kind::kError;
  e.error = why;
  stream->Push(e);
}

void WorkerImpl::ExpireKvWait(const std::string& id) {
  {
    MutexLock lock(&pending_mu_);
    auto it = pending_.find(id);
    if (it == pending_.end() || Clock::now() < it->second.kv_deadline) return;
  }
  kv_wait_timeouts_.fetch_add(1);
  log_->warn("{}: its KV did not arrive in time; reservation freed", id);
  CancelPending(id, DeadlineExceeded("the KV cache did not arrive in time"));
}

void WorkerImpl::OnNotification(const transfer::Notification& n) {
  {
    MutexLock lock(&handoff_mu_);
    handoffs_.push_back(n.message);
  }
  handoff_cv_.NotifyAll();
}

void WorkerImpl::HandoffLoop() {
  while (true) {
    std::string message;
    {
      MutexLock lock(&handoff_mu_);
      handoff_cv_.Wait(&handoff_mu_, [&] {
        handoff_mu_.AssertHeld();
        return handoff_stop_.load() || !handoffs_.empty();
      });
      if (handoff_stop_.load()) return;
      message = std::move(handoffs_.front());
      handoffs_.pop_front();
    }
    Handoff(message);
  }
}

void WorkerImpl::Handoff(const std::string& message) {
  std::string id;
  int32_t first_token = -1;
  try {
    const json j = json::parse(message);
    if (!JsonFloatsBounded(j)) return;
    if (j.at("kind").get<std::string>() != "kv_ready") return;
    id = j.at("id").get<std::string>();
    first_token = j.at("first_token").get<int32_t>();
  } catch (const std::exception& e) {
    log_->warn("ignoring a malformed notification: {}", e.what());
    return;
  }
  Pending p;
  {
    MutexLock lock(&pending_mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // cancelled or expired meanwhile
    p = std::move(it->second);
    pending_.erase(it);
  }
  auto sink = std::make_shared<StreamSink>(p.stream, Clock::now());
  if (Status st = backend_->SubmitPrefilled(std::move(p.request), first_token, sink); !st.ok()) {
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kError;
    e.error = st;
    p.stream->Push(e);
  }
}

}  // namespace tandem::cluster::worker_internal
