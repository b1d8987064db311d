// How tools appear in a chat prompt and how a tool-mode answer becomes OpenAI's tool_calls, in
// the Hermes-style format of structured/tool_call.h (what SmolLM2 was trained on), for chat
// templates without a tool section of their own (SmolLM2's has none, so the tools go into the
// system message):
//
//   system:    <the system prompt>\n\n + kToolsPreamble + <tools>{...}\n{...}</tools>
//   assistant: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//   tool:      <tool_response>\n...\n</tool_response>
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
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
// The prompt of a chat request. A template that renders tools itself (reads `tools`) gets the
// messages as they came (calls and tool results structured) and the tools as OpenAI's array;
// any other gets them in the format above, inside the messages' text. A template's refusal
// (raise_exception) is kInvalidArgument with its message.
StatusOr<std::string> RenderChatPrompt(const model::ChatTemplate& chat_template,
                                       const std::vector<model::ChatMessage>& messages,
                                       const std::vector<ToolDefinition>& tools,
                                       bool add_generation_prompt);
// The format the model writes calls in: for a template that renders tools itself, `chosen` when
// given (serve --tool-call-format), else the template's own (structured::ToolFormatOfTemplate);
// for any other template (or none) the Hermes format of the offer above.
engine::SamplingParams::ToolFormat ToolFormatFor(
    const model::ChatTemplate* chat_template,
    std::optional<engine::SamplingParams::ToolFormat> chosen);
// "call_" + 24 hex digits; thread-safe.
std::string NewToolCallId();

}  // namespace tandem::server
