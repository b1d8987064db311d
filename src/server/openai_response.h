// OpenAI-shaped response bodies: non-streaming completions, SSE chunks, usage, models, errors.
// All JSON is one line; strings with ill-formed UTF-8 are repaired with U+FFFD, never thrown on.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace tandem::server {

// "chatcmpl-<24 hex>" or "cmpl-<24 hex>"; thread-safe.
std::string NewRequestId(Endpoint endpoint);

struct ResponseContext {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool include_usage = false;  // stream_options.include_usage: chunks carry "usage": null
  bool logprobs = false;       // choices carry a logprobs object (else "logprobs": null)
  bool tools = false;          // chat answers may be tool calls
  engine::SamplingParams::ToolFormat tool_format = engine::SamplingParams::ToolFormat::kHermes;
};

// One function call of an answer (OpenAI's tool_calls entry).
struct ToolCallOut {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

// One token as a response's logprobs show it. Chat: {"token", "logprob", "bytes",
// "top_logprobs": [{"token", "logprob", "bytes"}]}; completions: the parallel arrays "tokens",
// "token_logprobs", "top_logprobs" (a {token: logprob} map holding the token itself and its
// alternatives) and "text_offset". A token's text is its piece when that is valid UTF-8, else
// "bytes:\xNN..." (OpenAI's form); "bytes" always holds the exact bytes.
struct TokenLogprobs {
  std::string piece;             // the token's raw bytes (may be part of a UTF-8 character)
  std::optional<float> logprob;  // nullopt: none (the first prompt token under echo)
  std::vector<std::pair<std::string, float>> top;  // alternatives (piece, logprob), best first
};

// One choice of a non-streaming response.
struct Choice {
  int index = 0;
  std::string text;
  std::string finish_reason;                 // "stop", "length"
  std::vector<TokenLogprobs> logprobs;       // rendered when ResponseContext::logprobs
  std::vector<ToolCallOut> tool_calls = {};  // chat: the answer is these calls (content null)
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// The whole body of a non-streaming response (choices in index order).
std::string CompletionBody(const ResponseContext& ctx, std::span<const Choice> choices,
                           const Usage& usage);
// One choice: index 0, no logprobs. finish_reason: "stop" or "length".
std::string CompletionBody(const ResponseContext& ctx, const std::string& text,
                           const std::string& finish_reason, const Usage& usage);

// The first chunk of a chat stream's choice: delta {"role": "assistant", "content": ""}.
std::string ChatRoleChunk(const ResponseContext& ctx, int index = 0);
// A content chunk of choice `index` (finish_reason null) with the logprobs of the tokens it
// covers; text_offset: bytes of the choice's text before this chunk (completions' text_offset).
std::string TextChunk(const ResponseContext& ctx, const std::string& text, int index = 0,
                      std::span<const TokenLogprobs> logprobs = {}, int64_t text_offset = 0);
// A chat chunk carrying choice `index`'s whole call: delta {"tool_calls": [{"index": 0, "id",
// "type": "function", "function": {"name", "arguments"}}]}.
std::string ToolCallChunk(const ResponseContext& ctx, const ToolCallOut& call, int index = 0,
                          int call_index = 0);
// The last chunk of choice `index`: empty delta/text with the finish reason.
std::string FinishChunk(const ResponseContext& ctx, const std::string& finish_reason,
                        int index = 0);
// The usage chunk (stream_options.include_usage): empty choices.
std::string UsageChunk(const ResponseContext& ctx, const Usage& usage);

// "data: <json>\n\n"
std::string SseEvent(const std::string& json);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// GET /v1/models: one entry per name.
std::string ModelsBody(const std::vector<std::string>& names, int64_t created);

}  // namespace tandem::server
