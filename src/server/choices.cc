#include "server/choices.h"

#include "server/http_util.h"
#include "server/openai_tools.h"
#include "structured/tool_call.h"

namespace tandem::server {

using serving::FinishReason;

namespace {

bool Succeeded(const serving::FinishInfo& info) {
  return info.reason == FinishReason::kStop || info.reason == FinishReason::kLength;
}

}  // namespace

ChoiceSet::ChoiceSet(ResponseContext ctx, std::vector<ChoiceRun> runs, int n,
                     std::shared_ptr<Doorbell> doorbell)
    : ctx_(std::move(ctx)),
      runs_(std::move(runs)),
      n_(std::max(1, n)),
      doorbell_(std::move(doorbell)),
      fork_due_taken_((runs_.size() + n_ - 1) / n_, n_ == 1) {}

ChoiceSet::~ChoiceSet() {
  for (const ChoiceRun& r : runs_) {
    if (!r.done) r.sink->MarkClientGone();
  }
}

void ChoiceSet::CancelAll() {
  for (const ChoiceRun& r : runs_) r.sink->MarkClientGone();
}

Status ChoiceSet::Submit(serving::GenerationBackend* backend) {
  for (size_t k = 0; k < runs_.size(); k += n_) {
    Status st = backend->Submit(std::move(runs_[k].request), runs_[k].sink);
    if (!st.ok()) {
      CancelAll();
      return st;
    }
  }
  return OkStatus();
}

std::vector<size_t> ChoiceSet::TakeDueForks() {
  std::vector<size_t> due;
  for (size_t p = 0; p < fork_due_taken_.size(); ++p) {
    if (fork_due_taken_[p] || !runs_[p * n_].sink->Started()) continue;
    fork_due_taken_[p] = true;
    for (size_t f = p * n_ + 1; f < std::min(runs_.size(), (p + 1) * n_); ++f) due.push_back(f);
  }
  return due;
}

Status ChoiceSet::SubmitForks(const std::vector<size_t>& forks,
                              serving::GenerationBackend* backend) {
  for (size_t f : forks) {
    if (runs_[f].sink->client_gone()) continue;
    Status st = backend->Submit(std::move(runs_[f].request), runs_[f].sink);
    if (st.ok()) continue;
    CancelAll();
    {
      MutexLock lock(&fork_mu_);
      if (!fork_refusal_) fork_refusal_ = st;
    }
    doorbell_->Ring();
    return st;
  }
  return OkStatus();
}

std::optional<Status> ChoiceSet::ForkRefusal() const {
  MutexLock lock(&fork_mu_);
  return fork_refusal_;
}

Usage ChoiceSet::TotalUsage() const {
  Usage u;
  for (const ChoiceRun& r : runs_) {
    // A prompt is counted once, from its first choice.
    if (r.index % n_ == 0) {
      u.prompt_tokens += r.info.prompt_tokens;
      u.cached_tokens += r.info.cached_prompt_tokens;
    }
    u.completion_tokens += r.info.completion_tokens;
  }
  return u;
}

std::optional<ChoiceSet::Whole> ChoiceSet::TryCollectWhole(Clock::time_point give_up,
                                                           double timeout_s) {
  if (!collecting_) {
    collecting_ = true;
    for (ChoiceRun& run : runs_) run.text = run.echo;
  }
  Whole out;
  if (std::optional<Status> refused = ForkRefusal()) {
    Outcome unused;
    out.error = SubmitError(*refused, &unused);
    return out;
  }
  for (ChoiceRun& run : runs_) {
    if (run.done) continue;
    RequestSink::Taken t = run.sink->Wait(Clock::duration::zero());
    run.text += t.text;
    if (t.prompt_logprobs) run.prompt_logprobs = std::move(*t.prompt_logprobs);
    for (auto& lp : t.logprobs) run.logprobs.push_back(std::move(lp));
    if (!t.finished) continue;
    run.done = true;
    run.info = t.info;
    if (!Succeeded(run.info)) {
      out.error = FailureError(run.info, timeout_s);
      return out;
    }
  }
  if (!std::all_of(runs_.begin(), runs_.end(), [](const ChoiceRun& r) { return r.done; })) {
    if (Clock::now() < give_up) return std::nullopt;
    // The backend should have timed the request out itself; stop waiting for it.
    serving::FinishInfo info;
    info.reason = FinishReason::kTimeout;
    out.error = FailureError(info, timeout_s);
    return out;
  }
  std::vector<Choice> choices;
  choices.reserve(runs_.size());
  for (ChoiceRun& run : runs_) {
    std::vector<ToolCallOut> calls = CallsOf(run);
    if (!run.prompt_logprobs.empty()) {
      run.logprobs.insert(run.logprobs.begin(),
                          std::make_move_iterator(run.prompt_logprobs.begin()),
                          std::make_move_iterator(run.prompt_logprobs.end()));
    }
    Choice c{run.index, std::move(run.text), serving::FinishReasonName(run.info.reason),
             std::move(run.logprobs), std::move(calls)};
    if (!c.tool_calls.empty()) {
      c.text.clear();
      c.finish_reason = "tool_calls";
    }
    choices.push_back(std::move(c));
  }
  out.body = CompletionBody(ctx_, choices, TotalUsage());
  return out;
}

std::vector<ToolCallOut> ChoiceSet::CallsOf(const ChoiceRun& run) const {
  std::vector<ToolCallOut> out;
  if (!ctx_.tools || run.info.reason != FinishReason::kStop) return out;
  auto calls = structured::ParseToolCalls(run.text, ctx_.tool_format);
  if (!calls) return out;
  for (const structured::ParsedToolCall& c : *calls) {
    out.push_back({NewToolCallId(), c.name, c.arguments_json});
  }
  return out;
}

bool ChoiceSet::SendToolModeText(ChoiceRun& run, RequestSink::Taken& t,
                                 const std::function<bool(const std::string&)>& send) {
  if (run.message) return SendNews(run, t, send);
  run.text += t.text;
  if (structured::MayBeToolCall(run.text, ctx_.tool_format)) {
    // Still possibly a call: hold the text, send only the logprobs.
    t.text.clear();
    return SendNews(run, t, send);
  }
  run.message = true;
  t.text = run.text;  // all that was held
  return SendNews(run, t, send);
}

bool ChoiceSet::SendNews(ChoiceRun& run, RequestSink::Taken& t,
                         const std::function<bool(const std::string&)>& send) {
  if (t.text.empty() && t.logprobs.empty()) return true;
  if (!send(SseEvent(TextChunk(ctx_, t.text, run.index, t.logprobs, run.text_offset)))) {
    return false;
  }
  for (const TokenLogprobs& lp : t.logprobs) run.text_offset += lp.piece.size();
  return true;
}

bool ChoiceSet::StreamStep(const std::function<bool(const std::string&)>& send, double timeout_s,
                           Clock::time_point give_up, bool* finished) {
  *finished = false;
  if (std::optional<Status> refused = ForkRefusal()) {
    // A choice was refused after others began: the error event ends the response.
    Outcome unused;
    if (!send(SseEvent(ApiErrorJson(SubmitError(*refused, &unused))))) return false;
    if (!send(kSseDone)) return false;
    *finished = true;
    return true;
  }
  for (ChoiceRun& run : runs_) {
    if (run.started) continue;
    run.started = true;
    if (ctx_.endpoint == Endpoint::kChatCompletions &&
        !send(SseEvent(ChatRoleChunk(ctx_, run.index)))) {
      return false;
    }
    if (!run.echo.empty() && ctx_.logprobs) {
      run.echo_waits = true;  // sent with the prompt's logprobs
    } else if (!run.echo.empty()) {
      if (!send(SseEvent(TextChunk(ctx_, run.echo, run.index)))) return false;
      run.text_offset = static_cast<int64_t>(run.echo.size());
    }
  }
  for (ChoiceRun& run : runs_) {
    if (run.done) continue;
    RequestSink::Taken t = run.sink->Wait(Clock::duration::zero());
    if (run.echo_waits && (t.prompt_logprobs || t.finished)) {
      run.echo_waits = false;
      const std::vector<TokenLogprobs> none;
      const auto& prompt = t.prompt_logprobs ? *t.prompt_logprobs : none;
      if (!send(SseEvent(TextChunk(ctx_, run.echo, run.index, prompt, 0)))) return false;
      for (const TokenLogprobs& lp : prompt) run.text_offset += lp.piece.size();
    }
    if (!(ctx_.tools ? SendToolModeText(run, t, send) : SendNews(run, t, send))) return false;
    if (!t.finished) continue;
    run.done = true;
    run.info = t.info;
    if (ctx_.tools && !run.message && Succeeded(run.info)) {
      // The held answer: a call, or (cut short, or not a call after all) content.
      if (auto calls = CallsOf(run); !calls.empty()) {
        for (size_t k = 0; k < calls.size(); ++k) {
          if (!send(SseEvent(ToolCallChunk(ctx_, calls[k], run.index, static_cast<int>(k))))) {
            return false;
          }
        }
        if (!send(SseEvent(FinishChunk(ctx_, "tool_calls", run.index)))) return false;
        continue;
      }
      if (!run.text.empty() && !send(SseEvent(TextChunk(ctx_, run.text, run.index)))) return false;
    }
    if (!Succeeded(run.info)) {
      // One failed choice fails the response: the error event, then the end.
      CancelAll();
      if (!send(SseEvent(ApiErrorJson(FailureError(run.info, timeout_s))))) return false;
      if (!send(kSseDone)) return false;
      *finished = true;
      return true;
    }
    if (!send(SseEvent(FinishChunk(ctx_, serving::FinishReasonName(run.info.reason), run.index)))) {
      return false;
    }
  }
  const bool all_done =
      std::all_of(runs_.begin(), runs_.end(), [](const ChoiceRun& r) { return r.done; });
  if (all_done) {
    if (ctx_.include_usage && !send(SseEvent(UsageChunk(ctx_, TotalUsage())))) return false;
    if (!send(kSseDone)) return false;
    *finished = true;
    return true;
  }
  if (Clock::now() >= give_up) {
    // The backend should have timed the request out itself; stop waiting for it.
    CancelAll();
    serving::FinishInfo info;
    info.reason = FinishReason::kTimeout;
    if (!send(SseEvent(ApiErrorJson(FailureError(info, timeout_s))))) return false;
    if (!send(kSseDone)) return false;
    *finished = true;
  }
  return true;
}

}  // namespace tandem::server
