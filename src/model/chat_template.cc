#include "model/chat_template.h"

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace tandem::model {
namespace {

using ojson = nlohmann::ordered_json;

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string ApplyGemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out, first_user_prefix;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    first_user_prefix = std::string(Trim(messages[0].content)) + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role == "assistant" ? "model" : messages[i].role;
    out.append("<start_of_turn>").append(role).append("\n");
    if (i == first) out.append(first_user_prefix);
    out.append(Trim(messages[i].content)).append("<end_of_turn>\n");
  }
  if (add_generation_prompt) out.append("<start_of_turn>model\n");
  return out;
}

// A message as chat templates expect it: role, content, and for tool use the calls (their
// arguments as objects, which templates pass to tojson) and the id a tool result answers.
ojson MessageJson(const ChatMessage& m) {
  ojson j = {{"role", m.role}, {"content", m.content}};
  if (!m.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const ChatToolCall& c : m.tool_calls) {
      ojson args = ojson::parse(c.arguments_json, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded()) args = c.arguments_json;
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
    }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  return j;
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& template_text, std::string bos_token,
                                           std::string eos_token, bool tokenizer_adds_bos) {
  if (template_text.empty()) return InvalidArgument("chat template is empty");
  auto parsed = jinja::Template::Parse(template_text);
  if (!parsed.ok()) return InvalidArgument("chat template: " + parsed.status().message());
  ChatTemplate t;
  t.kind_ = Kind::kJinja;
  t.jinja_ = std::make_shared<const jinja::Template>(std::move(*parsed));
  t.source_ = template_text;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.strip_leading_bos_ = tokenizer_adds_bos && !t.bos_token_.empty();
  return t;
}

ChatTemplate ChatTemplate::Gemma() { return ChatTemplate(); }

bool ChatTemplate::reads_tools() const { return jinja_ != nullptr && jinja_->Reads("tools"); }

StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt,
                                          const std::string& tools_json) const {
  if (kind_ == Kind::kGemma) return ApplyGemma(messages, add_generation_prompt);
  ojson context = ojson::object();
  ojson list = ojson::array();
  for (const ChatMessage& m : messages) list.push_back(MessageJson(m));
  context["messages"] = std::move(list);
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  context["tools"] = nullptr;  // as apply_chat_template passes it when there are none
  if (!tools_json.empty()) {
    ojson tools = ojson::parse(tools_json, nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded() || !tools.is_array())
      return InvalidArgument("tools: not a JSON array");
    context["tools"] = std::move(tools);
  }
  auto text = jinja_->Render(context);
  if (!text.ok()) return InvalidArgument("chat template: " + text.status().message());
  if (strip_leading_bos_ && text->starts_with(bos_token_)) text->erase(0, bos_token_.size());
  return text;
}

}  // namespace tandem::model
