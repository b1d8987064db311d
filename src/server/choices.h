// The choices of one OpenAI response: n per prompt, and several prompts per completions call.
// Each choice is one GenerationRequest with its own RequestSink; a ChoiceSet submits them and
// gathers their output in index order (choice index = prompt * n + i), whole or as SSE chunks.
//
// KV sharing between the n choices of a prompt: the first choice is submitted alone; the others
// (its forks) follow once it has produced its first token, when the prompt's full KV blocks are
// in the prefix cache (or, disaggregated, in the worker's cache and the KV pool), so they compute
// only the prompt's last partial block. Choice i draws with seed + i. Nobody waits for that
// first token: the pump sees it (TakeDueForks) and hands the forks to a submitting thread
// (SubmitForks), so a request with n > 1 holds no handler thread while it queues.
//
// Nothing here blocks on output: the sinks ring the set's doorbell, and its owner (the
// response pump of server/response_pump.h) then takes what is new.
//
// Thread-safety: one ChoiceSet per request, used by one thread at a time (the handler, then the
// pump), except SubmitForks, which runs on another thread beside the pump: it touches only the
// forks' requests (which nothing else reads after Submit), their sinks (thread-safe) and the
// refusal under fork_mu_. The sinks are fed by the backend's threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/request_sink.h"
#include "serving/backend.h"

namespace tandem::server {

struct ChoiceRun {
  int index = 0;
  int prompt = 0;                      // which prompt of the request
  serving::GenerationRequest request;  // moved into the backend at Submit
  std::shared_ptr<RequestSink> sink;
  std::string echo;  // completions echo: the prompt's text, sent before the output
  // echo with logprobs: the prompt's tokens (the first without a value), which precede the
  // output's in the logprobs; streamed, the echo waits for them.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool echo_waits = false;
  // Output gathered so far.
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  int64_t text_offset = 0;  // bytes of the choice's text already sent (streaming)
  bool started = false;     // streaming: the role chunk / echo went out
  // Tool mode, streaming: `text` is held back while the answer may still be a call; `message`
  // once it cannot be one (what was held went out as content).
  bool message = false;
  bool done = false;
  serving::FinishInfo info;
};

class ChoiceSet {
 public:
  using Clock = std::chrono::steady_clock;

  // runs: in index order, each with its request and sink (all ringing `doorbell`, not null);
  // n: choices per prompt.
  ChoiceSet(ResponseContext ctx, std::vector<ChoiceRun> runs, int n,
            std::shared_ptr<Doorbell> doorbell);
  // Cancels whatever is still running (the client went away).
  ~ChoiceSet();

  // Submits the first choice of every prompt. On a refusal the choices already submitted are
  // cancelled and the refusal is returned.
  Status Submit(serving::GenerationBackend* backend);

  // The pump: the forks now due (their prompt's first choice has a token or has finished), each
  // returned once, in index order; empty when n == 1.
  std::vector<size_t> TakeDueForks();
  // Any one thread (not the pump's step): submits those forks, skipping any whose client is
  // gone. A refusal cancels the set, is kept for the pump's next step (which answers with it) and
  // rings the doorbell; the forks after it are not submitted. Returns the refusal, or OK.
  Status SubmitForks(const std::vector<size_t>& forks, serving::GenerationBackend* backend)
      TANDEM_EXCLUDES(fork_mu_);

  // Non-streaming: takes what is new; once every choice finished, the whole body, or the error
  // of the first choice that failed (nullopt before). At `give_up` (past the request's
  // deadline: the backend should have ended it) a timeout error. timeout_s names the request
  // timeout in errors.
  struct Whole {
    std::string body;  // when no error
    std::optional<ApiError> error;
  };
  std::optional<Whole> TryCollectWhole(Clock::time_point give_up, double timeout_s);

  // Streaming: sends what is new as SSE events through `send` (false: the client is gone).
  // Returns false when sending failed; sets *finished once the last event ([DONE]) went out.
  // At `give_up` an unfinished response ends with a timeout error event.
  bool StreamStep(const std::function<bool(const std::string&)>& send, double timeout_s,
                  Clock::time_point give_up, bool* finished);

  std::shared_ptr<Doorbell> doorbell() const { return doorbell_; }

  // Marks every sink's client gone (the next token cancels its request).
  void CancelAll();

  int size() const { return static_cast<int>(runs_.size()); }

 private:
  Usage TotalUsage() const;
  // Tool mode: the call a finished answer makes, if it is one.
  std::vector<ToolCallOut> CallsOf(const ChoiceRun& run) const;
  // Tool mode, streaming: sends text that can no longer be a call; keeps the rest in run.held.
  bool SendToolModeText(ChoiceRun& run, RequestSink::Taken& t,
                        const std::function<bool(const std::string&)>& send);
  bool SendNews(ChoiceRun& run, RequestSink::Taken& t,
                const std::function<bool(const std::string&)>& send);
  std::optional<Status> ForkRefusal() const TANDEM_EXCLUDES(fork_mu_);

  ResponseContext ctx_;
  std::vector<ChoiceRun> runs_;
  int n_;
  std::shared_ptr<Doorbell> doorbell_;
  std::vector<bool> fork_due_taken_;  // per prompt: its forks were handed out (the pump's)
  mutable Mutex fork_mu_;
  std::optional<Status> fork_refusal_ TANDEM_GUARDED_BY(fork_mu_);
  bool collecting_ = false;  // TryCollectWhole began (texts start with their echo)
};

}  // namespace tandem::server
