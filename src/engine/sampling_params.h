// The sampling settings of one request, and what one draw yields, apart from the sampler so that
// code which only carries them (the HTTP front door, the conductor, the worker protocol) does not
// pull in the engine.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem::engine {

// Most alternatives a draw reports with its log-probability (OpenAI's top_logprobs limit).
inline constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;       // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  uint64_t seed = 0;

  // Logit adjustments, applied before the filters above (and before greedy's argmax), in this
  // order: logit_bias, the min_tokens mask, the penalties.
  // OpenAI's penalties, over the tokens generated so far (not the prompt): a token that appeared
  // loses presence_penalty once and frequency_penalty per occurrence. In [-2, 2]; 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // vLLM's (CTRL's) repetition penalty over the prompt and the generated tokens: a positive
  // logit is divided by it, a negative one multiplied. In (0, 10]; 1: off.
  float repetition_penalty = 1.0f;
  // (token id, bias added to its logit), bias in [-100, 100]; ids unique.
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // End-of-generation tokens (the model's and stop_token_ids) are impossible before this many
  // tokens were generated.
  int min_tokens = 0;
  // Tokens that end the generation when drawn (besides the model's end-of-generation tokens,
  // and also under ignore_eos); the token is part of the output.
  std::vector<int32_t> stop_token_ids = {};
  // -1: no log-probabilities. 0..kMaxLogprobs: each draw reports the drawn token's
  // log-probability and that many most likely alternatives. Values are log-softmax of the raw
  // logits: before bias, penalties and temperature (vLLM's default, "raw logprobs").
  int logprobs = -1;
  // -1: none. 0..kMaxLogprobs: every prompt token after the first reports its raw
  // log-probability given the tokens before it, and that many alternatives (completions' echo
  // with logprobs). The prompt is then computed whole (no prefix-cache reuse).
  int prompt_logprobs = -1;
  // Structured output: a JSON Schema (structured/json_schema.h) the output must be a document
  // of; empty: none. The front door compiles it before submitting (a bad schema is a 400).
  std::string json_schema = {};
  // Tool calls (structured/tool_call.h): json_schema is then the schema of one call, and the
  // answer is calls in tool_format (kRequired) or either that or a message (kAuto).
  enum class ToolMode { kNone, kAuto, kRequired };
  ToolMode tool_mode = ToolMode::kNone;
  // How a call is written (structured/tool_call.h ToolCallSyntaxOf): the format the model's chat
  // template asks for. kHermes: <tool_call>{"name", "arguments"}</tool_call> per call;
  // kLlama3Json: bare {"name", "parameters"} objects separated by ';'; kMistral: [TOOL_CALLS]
  // followed by a JSON array of {"name", "arguments"}.
  enum class ToolFormat { kHermes, kLlama3Json, kMistral };
  ToolFormat tool_format = ToolFormat::kHermes;
  // Tool mode: the most calls one answer may make, one after another (OpenAI's
  // parallel_tool_calls); 1..kMaxToolCalls.
  static constexpr int kMaxToolCalls = 8;
  int max_tool_calls = 1;

  // InvalidArgument naming the bad field (negative temperature, top_p outside (0, 1], ...).
  // Token ids are checked against the vocabulary by ValidateTokens.
  Status Validate() const;
  // InvalidArgument when a logit_bias or stop_token_ids id is outside [0, vocab_size).
  Status ValidateTokens(int vocab_size) const;
  // Whether any logit adjustment is on (the sampler then copies the logits before adjusting).
  bool AdjustsLogits() const;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// One drawn token. logprob and top are filled only when SamplingParams::logprobs >= 0.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top = {};  // the most likely tokens, descending (lowest id on ties)
};

}  // namespace tandem::engine
