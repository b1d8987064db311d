// The choices of one OpenAI response: n per prompt, and several prompts per completions call.
// Each choice is one GenerationRequest with its own RequestSink; a ChoiceSet submits them and
// gathers their output in index order (choice index = prompt * n + i), whole or as SSE chunks.
//
// KV sharing between the n choices of a prompt: the first choice is submitted alone; the others
// follow once it has produced its first token, when the prompt's full KV blocks are in the
// prefix cache (or, disaggregated, in the worker's cache and the KV pool), so they compute only
// the prompt's last partial block. Choice i draws with seed + i.
//
// Nothing here blocks on output: the sinks ring the set's doorbell, and its owner (the
// response pump of server/response_pump.h) then takes what is new.
//
// Thread-safety: one ChoiceSet per request, used by one thread at a time (the handler, then the
// pump); the sinks inside are fed by the backend's threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

  // Submits every choice (the first of each prompt, then the others once it started, waiting
  // until `deadline` at most). On a refusal the choices already submitted are cancelled and the
  // refusal is returned.
  Status Submit(serving::GenerationBackend* backend, Clock::time_point deadline);

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

  ResponseContext ctx_;
  std::vector<ChoiceRun> runs_;
  int n_;
  std::shared_ptr<Doorbell> doorbell_;
  std::vector<bool> submitted_;
  bool collecting_ = false;  // TryCollectWhole began (texts start with their echo)
};

}  // namespace tandem::server
