// OpenAI-shaped response bodies: non-streaming completions, SSE chunks, usage, models, errors.
// All JSON is one line; strings with ill-formed UTF-8 are repaired with U+FFFD, never thrown on.
#pragma once

#include <cstdint>
#include <string>

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
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// The whole body of a non-streaming response. finish_reason: "stop" or "length".
std::string CompletionBody(const ResponseContext& ctx, const std::string& text,
                           const std::string& finish_reason, const Usage& usage);

// The first chunk of a chat stream: delta {"role": "assistant", "content": ""}.
std::string ChatRoleChunk(const ResponseContext& ctx);
// A content chunk (finish_reason null).
std::string TextChunk(const ResponseContext& ctx, const std::string& text);
// The last choice chunk: empty delta/text with the finish reason.
std::string FinishChunk(const ResponseContext& ctx, const std::string& finish_reason);
// The usage chunk (stream_options.include_usage): empty choices.
std::string UsageChunk(const ResponseContext& ctx, const Usage& usage);

// "data: <json>\n\n"
std::string SseEvent(const std::string& json);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// GET /v1/models
std::string ModelsBody(const std::string& model, int64_t created);

}  // namespace tandem::server
