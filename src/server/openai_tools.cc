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
  return std::string(structured::kToolCallOpen) + "\n" +
         json{{"name", name}, {"arguments", args}}.dump() + "\n" +
         std::string(structured::kToolCallClose);
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

std::string NewToolCallId() {
  // The request-id generator's randomness, another prefix.
  const std::string id = NewRequestId(Endpoint::kCompletions);  // "cmpl-" + 24 hex
  return "call_" + id.substr(id.find('-') + 1);
}

}  // namespace tandem::server
