// Parsing and validation of OpenAI /v1/chat/completions and /v1/completions request bodies into
// one internal struct. Every rejection is an ApiError with the HTTP status (400 for malformed or
// out-of-range input, 404 for an unknown model) and a message naming the offending field.
//
// Unknown fields are ignored (clients send many optional ones); known but unsupported features
// (tools, response_format other than text, suffix, best_of > n) are refused with a clear 400
// rather than ignored.
// Tokenization and the prompt-length check happen later (BuildPrompt), as they need the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "server/api_error.h"

namespace tandem::server {

enum class Endpoint { kChatCompletions, kCompletions };

struct ProtocolLimits {
  std::string served_model_name;     // the name /v1/models lists first and responses carry
  std::vector<std::string> aliases;  // further accepted `model` values (--served-model-name)
  int max_model_len = 2048;          // tokens: prompt + completion at most
  int max_n = 16;                    // choices per request (n) at most
  int max_prompts = 16;              // prompts per completions request at most
  // How the model writes tool calls (structured/tool_call.h): its chat template's format.
  engine::SamplingParams::ToolFormat tool_format = engine::SamplingParams::ToolFormat::kHermes;
};

// Most choices (n) times prompts one request may ask for.
inline constexpr int kMaxChoicesPerRequest = 64;

// A function the model may call (chat "tools").
struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json;  // a JSON Schema (compiled at parse time: supported), keys sorted
  std::string parameters_ordered_json;  // the same in the request's key order (for templates)
};

// One prompt of a completions request: text, or token ids (non-empty then).
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> token_ids;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;                         // the served model name (filled in when absent)
  std::vector<model::ChatMessage> messages;  // chat: non-empty
  std::vector<CompletionPrompt> prompts;     // completions: 1..max_prompts
  std::optional<int> max_tokens;             // nullopt: up to the context
  // Temperature, filters, penalties, logit_bias, min_tokens, stop_token_ids, logprobs (chat:
  // top_logprobs when logprobs is true; completions: logprobs), seed (random when absent).
  engine::SamplingParams sampling;
  bool seeded = false;  // the request gave `seed`
  int n = 1;            // choices per prompt; choice i draws with seed + i
  bool echo = false;    // completions: the prompt text precedes the output
  // Chat: the tools offered to the model (rendered into the prompt; none under tool_choice
  // "none"). With tools, sampling.tool_mode says whether the answer must be a call.
  std::vector<ToolDefinition> tools;
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (benchmarks)
  // Extensions: this request's SLOs in milliseconds (0: the server's --slo-ttft-ms/--slo-tbt-ms).
  double slo_ttft_ms = 0;
  double slo_tbt_ms = 0;
};

// 404 model_not_found unless `name` is the served name or one of its aliases.
std::optional<ApiError> CheckModel(const std::string& name, const ProtocolLimits& limits);

// Parses `body` for `endpoint`. On failure returns the error; `out` is then unspecified.
std::optional<ApiError> ParseRequest(Endpoint endpoint, std::string_view body,
                                     const ProtocolLimits& limits, ParsedRequest* out);

// Renders/tokenizes the prompt and checks the lengths: chat through `chat_template` (null: the
// model has none, and `no_template_reason` says why) with parse_special; completions with the
// vocabulary's add_bos and no special parsing. Fills *prompt_tokens and *max_tokens (the
// effective completion budget). Errors: empty prompt, token ids outside the vocabulary, prompt
// (+ max_tokens) longer than the context — the message names both lengths. `prompt_index`
// picks one of a completions request's prompts.
std::optional<ApiError> BuildPrompt(const ParsedRequest& request, const model::Tokenizer& tokenizer,
                                    const model::ChatTemplate* chat_template,
                                    const std::string& no_template_reason, int max_model_len,
                                    std::vector<int32_t>* prompt_tokens, int* max_tokens,
                                    size_t prompt_index = 0);

}  // namespace tandem::server
