#include "server/openai_tools.h"

#include <nlohmann/json.hpp>

#include "server/openai_response.h"
#include "structured/tool_call.h"

namespace tandem::server {
namespace {

using nlohmann::json;

constexpr const char* kToolsPreamble =
    "You can call the functions listed below. To call one, answer with only the call, in this "
    "form:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments as JSON>}}\n"
    "</tool_call>\nOtherwise answer normally.\n";

}  // namespace

std::string RenderToolCall(const std::string& name, const std::string& arguments_json) {
  json args = json::parse(arguments_json, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded()) args = json::object();
  const auto& hermes = structured::ToolCallSyntaxOf(structured::ToolFormat::kHermes);
  return std::string(hermes.call_open) + "\n" + json{{"name", name}, {"arguments", args}}.dump() +
         "\n" + std::string(hermes.call_close);
}

std::string RenderToolResult(const std::string& content) {
  return "<tool_response>\n" + content + "\n</tool_response>";
}

std::vector<model::ChatMessage> WithToolsOffered(const std::vector<model::ChatMessage>& messages,
                                                 const std::vector<ToolDefinition>& tools) {
  if (tools.empty()) return messages;
  std::string block = kToolsPreamble;
  block += "<tools>\n";
  for (const ToolDefinition& t : tools) {
    json fn = {{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = json::parse(t.parameters_json, nullptr, /*allow_exceptions=*/false);
    block += json{{"type", "function"}, {"function", fn}}.dump() + "\n";
  }
  block += "</tools>";
  std::vector<model::ChatMessage> out = messages;
  if (!out.empty() && out.front().role == "system") {
    out.front().content += "\n\n" + block;
  } else {
    out.insert(out.begin(), model::ChatMessage{"system", block});
  }
  return out;
}

StatusOr<std::string> RenderChatPrompt(const model::ChatTemplate& chat_template,
                                       const std::vector<model::ChatMessage>& messages,
                                       const std::vector<ToolDefinition>& tools,
                                       bool add_generation_prompt) {
  if (chat_template.reads_tools()) {
    std::string tools_json;
    if (!tools.empty()) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const ToolDefinition& t : tools) {
        nlohmann::ordered_json fn = {{"name", t.name}};
        if (!t.description.empty()) fn["description"] = t.description;
        fn["parameters"] = nlohmann::ordered_json::parse(t.parameters_ordered_json, nullptr, false);
        list.push_back({{"type", "function"}, {"function", std::move(fn)}});
      }
      tools_json = list.dump();
    }
    return chat_template.Apply(messages, add_generation_prompt, tools_json);
  }
  std::vector<model::ChatMessage> inline_calls = messages;
  for (model::ChatMessage& m : inline_calls) {
    for (const model::ChatToolCall& c : m.tool_calls)
      m.content += RenderToolCall(c.name, c.arguments_json);
    m.tool_calls.clear();
    if (m.role == "tool") m.content = RenderToolResult(m.content);
    m.tool_call_id.clear();
  }
  return chat_template.Apply(WithToolsOffered(inline_calls, tools), add_generation_prompt);
}

engine::SamplingParams::ToolFormat ToolFormatFor(
    const model::ChatTemplate* chat_template,
    std::optional<engine::SamplingParams::ToolFormat> chosen) {
  if (chat_template == nullptr || !chat_template->reads_tools()) {
    return engine::SamplingParams::ToolFormat::kHermes;
  }
  if (chosen) return *chosen;
  return structured::ToolFormatOfTemplate(chat_template->source());
}

std::string NewToolCallId() {
  // The request-id generator's randomness, another prefix.
  const std::string id = NewRequestId(Endpoint::kCompletions);  // "cmpl-" + 24 hex
  return "call_" + id.substr(id.find('-') + 1);
}

}  // namespace tandem::server
