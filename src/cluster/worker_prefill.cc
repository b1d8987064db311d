// The worker's prefill side (worker_impl_internal.h): a prompt computed, its KV pushed layer by
// layer into the blocks a decode worker reserved, and the kv_ready notification at the end;
// or one stage of a pipelined prefill.
#include <future>
#include <nlohmann/json.hpp>

#include "cluster/worker_impl_internal.h"
#include "common/cluster_auth.h"
#include "common/http.h"

namespace tandem::cluster::worker_internal {
namespace {

using nlohmann::json;

// The transfer-engine notification that tells a decode worker a request's KV is complete.
std::string KvReadyNotification(const std::string& id, int32_t first_token,
                                const std::string& from) {
  return json{{"kind", "kv_ready"}, {"id", id}, {"first_token", first_token}, {"from", from}}
      .dump();
}

// The prefill side's sink: at the first token, completes the KV push and notifies.
class PrefillSink : public serving::GenerationSink {
 public:
  PrefillSink(std::shared_ptr<KvPusher> pusher, std::string id, std::string from)
      : pusher_(std::move(pusher)), id_(std::move(id)), from_(std::move(from)) {}
  bool OnToken(const engine::SampledToken& token) override {
    first_token_ = token;
    push_status_ = pusher_->Finish(KvReadyNotification(id_, token.token, from_));
    return true;
  }
  void OnFinish(const serving::FinishInfo& info) override { done_.set_value(info); }

  std::future<serving::FinishInfo> future() { return done_.get_future(); }
  const engine::SampledToken& first_token() const { return first_token_; }
  const Status& push_status() const { return push_status_; }

 private:
  std::shared_ptr<KvPusher> pusher_;
  std::string id_, from_;
  engine::SampledToken first_token_;
  Status push_status_ = Internal("no token was produced");
  std::promise<serving::FinishInfo> done_;
};

}  // namespace

StatusOr<transfer::SegmentHandle> WorkerImpl::OpenSegment(const std::string& name) {
  MutexLock lock(&segments_mu_);
  auto it = segments_.find(name);
  if (it != segments_.end()) return it->second;
  TANDEM_ASSIGN_OR_RETURN(transfer::SegmentHandle h, te_->OpenSegment(name));
  segments_[name] = h;
  return h;
}

void WorkerImpl::DropSegment(const std::string& name) {
  MutexLock lock(&segments_mu_);
  auto it = segments_.find(name);
  if (it == segments_.end()) return;
  (void)te_->CloseSegment(it->second);
  segments_.erase(it);
}

void WorkerImpl::HandlePrefill(const httplib::Request& req, httplib::Response& res) {
  const InFlight in_flight(&prefills_in_flight_);
  if (!CanPrefill(role_.load())) {
    return ReplyError(res, FailedPrecondition("worker " + options_.name + " does not prefill"));
  }
  auto call = PrefillCall::FromJson(req.body);
  if (!call.ok()) return ReplyError(res, call.status());
  const int n_prompt = static_cast<int>(call->prompt_tokens.size());
  if (Status st = KvPusher::CheckTarget(engine_->kv(), call->target, n_prompt); !st.ok()) {
    return ReplyError(res, st);
  }
  auto handle = OpenSegment(call->target.segment);
  if (!handle.ok()) {
    return ReplyError(res, Unavailable("cannot open the decode worker's KV segment: " +
                                       handle.status().message()));
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(call->timeout_ms);
  auto pusher = std::make_shared<KvPusher>(te_.get(), &engine_->kv(), *handle, call->target,
                                           n_prompt, deadline, options_.kv_transfer_timeout);
  if (call->stage.pipelined()) return HandleStage(*call, *pusher, deadline, res);
  auto sink = std::make_shared<PrefillSink>(pusher, call->id, options_.name);
  auto finished = sink->future();
  serving::GenerationRequest g;
  g.id = call->id;
  g.prompt_tokens = std::move(call->prompt_tokens);
  g.max_tokens = 1;
  g.ignore_eos = true;
  g.sampling = call->sampling;
  g.deadline = deadline;
  if (Status st = backend_->SubmitObserved(std::move(g), sink, pusher); !st.ok()) {
    return ReplyError(res, st);
  }
  // The backend finishes every request by its deadline; the slack covers the last step.
  if (finished.wait_until(deadline + std::chrono::seconds(10)) != std::future_status::ready) {
    return ReplyError(res, DeadlineExceeded("prefill did not finish in time"));
  }
  const serving::FinishInfo info = finished.get();
  kv_bytes_pushed_.fetch_add(pusher->bytes_sent());
  if (info.completion_tokens < 1) {
    return ReplyError(res, info.reason == serving::FinishReason::kTimeout
                               ? DeadlineExceeded("prefill: " + info.message)
                               : Internal("prefill failed: " + info.message));
  }
  if (!sink->push_status().ok()) {
    CountPushFailure(*pusher, call->target.segment);
    log_->warn("{}: {}", call->id, sink->push_status().ToString());
    return ReplyError(res, Unavailable(sink->push_status().message()));
  }
  PrefillResult r;
  r.first_token = sink->first_token();
  r.cached_tokens = info.cached_prompt_tokens;
  r.queue_seconds = info.queue_seconds;
  r.transfer_seconds = pusher->tail_seconds();
  r.prefill_seconds = std::max(0.0, info.ttft_seconds - info.queue_seconds - r.transfer_seconds);
  r.kv_bytes = pusher->bytes_sent();
  res.set_content(r.ToJson(), "application/json");
}

void WorkerImpl::CountPushFailure(const KvPusher& pusher, const std::string& segment) {
  if (pusher.failure_state() == transfer::TransferState::kTimedOut) {
    transfer_timeouts_.fetch_add(1);
  } else {
    transfer_failures_.fetch_add(1);
  }
  DropSegment(segment);
}

void WorkerImpl::HandleStage(const PrefillCall& call, KvPusher& pusher, Clock::time_point deadline,
                             httplib::Response& res) {
  const PipelineStage& stage = call.stage;
  const int n_layers = engine_->config().n_layers;
  if (stage.end_layer > n_layers || stage.last() != (stage.end_layer == n_layers) ||
      (stage.index == 0) != (stage.begin_layer == 0)) {
    return ReplyError(
        res, InvalidArgument(fmt::format(
                 "stage {} of {} runs layers {}..{} of a model of {}: stages must "
                 "cover the layers in order",
                 stage.index, stage.stages, stage.begin_layer, stage.end_layer, n_layers)));
  }
  std::unique_ptr<httplib::Client> next;
  if (!stage.last()) {
    next = std::make_unique<httplib::Client>(stage.next_host, stage.next_port);
    next->set_keep_alive(true);
    SetHttpClientDeadline(*next, deadline);
  }
  auto send = [&](const StageInput& in) -> Status {
    const std::string body = in.Encode();
    const std::string peer = "pipeline stage " + stage.next_worker;
    ClusterCallHeaders signed_call = SignClusterCall("POST", "/v1/stage_input", body);
    auto r = next->Post("/v1/stage_input", signed_call.headers, body, "application/octet-stream");
    if (!r) return Unavailable(peer + " did not answer: " + httplib::to_string(r.error()));
    TANDEM_RETURN_IF_ERROR(CheckClusterReply(*r, signed_call.nonce, peer));
    if (r->status != 200) return StatusFromErrorJson(r->body, peer + " refused a chunk");
    return OkStatus();
  };
  auto notify = [&](const engine::SampledToken& t) {
    return KvReadyNotification(call.id, t.token, options_.name);
  };
  const StageRun run{call.id, stage.session, call.prompt_tokens, stage, call.sampling, deadline};
  const Clock::time_point started = Clock::now();
  auto outcome = RunPipelineStage(run, *backend_, pusher, stage_inbox_, send, notify);
  kv_bytes_pushed_.fetch_add(pusher.bytes_sent());
  if (!outcome.ok()) {
    if (pusher.failure_state() != transfer::TransferState::kCompleted) {
      CountPushFailure(pusher, call.target.segment);
    }
    log_->warn("{}: pipeline stage {} of {}: {}", call.id, stage.index, stage.stages,
               outcome.status().ToString());
    return ReplyError(res, outcome.status());
  }
  PrefillResult r;
  r.first_token = outcome->first_token;
  r.transfer_seconds = pusher.tail_seconds();
  r.prefill_seconds = std::max(0.0, Seconds(Clock::now() - started) - r.transfer_seconds);
  r.kv_bytes = pusher.bytes_sent();
  r.stage_bytes_sent = outcome->bytes_sent;
  r.stage_wait_seconds = outcome->wait_seconds;
  log_->info(
      "{}: pipeline stage {} of {} (layers {}..{}, {} tokens in chunks of {}): {:.2f} s "
      "computing, {:.2f} s waiting for the previous stage, {:.1f} MiB to the next, {:.1f} MiB "
      "of KV",
      call.id, stage.index, stage.stages, stage.begin_layer, stage.end_layer,
      call.prompt_tokens.size(), stage.chunk_tokens, outcome->compute_seconds,
      outcome->wait_seconds, outcome->bytes_sent / 1048576.0, r.kv_bytes / 1048576.0);
  res.set_content(r.ToJson(), "application/json");
}

}  // namespace tandem::cluster::worker_internal
