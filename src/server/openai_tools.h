// How tools appear in a chat prompt and how a tool-mode answer becomes OpenAI's tool_calls, in
// the Hermes-style format of structured/tool_call.h (what SmolLM2 was trained on; its GGUF chat
// template has no tool section, so the tools go into the system message):
//
//   system:    <the system prompt>\n\n + kToolsPreamble + <tools>{...}\n{...}</tools>
//   assistant: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//   tool:      <tool_response>\n...\n</tool_response>
#pragma once

#include <string>
#include <vector>

#include "model/chat_template.h"
#include "server/openai_request.h"

namespace tandem::server {

// An assistant turn's call, as the model writes it.
std::string RenderToolCall(const std::string& name, const std::string& arguments_json);
// A tool message's content, as the model reads it.
std::string RenderToolResult(const std::string& content);
// The messages with the tools described in the system message (added when there is none);
// unchanged without tools.
std::vector<model::ChatMessage> WithToolsOffered(const std::vector<model::ChatMessage>& messages,
                                                 const std::vector<ToolDefinition>& tools);
// "call_" + 24 hex digits; thread-safe.
std::string NewToolCallId();

}  // namespace tandem::server
