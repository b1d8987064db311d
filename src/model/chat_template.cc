// Recognises chat templates by fixed markers instead of running Jinja. Every recognised
// template renders byte-identically to what jinja2 produces for it (tests compare against
// tests/golden/tokenizer/chat_template_golden.json).
#include "model/chat_template.h"

namespace tandem::model {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

// Jinja string-literal escapes that may appear inside a quoted default system message.
std::string UnescapeJinjaLiteral(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The default system message of templates shaped like SmolLM2's / Qwen2's:
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\n<DEFAULT><|im_end|>\n' }}{% endif %}
// nullopt when the template has no such branch.
StatusOr<std::optional<std::string>> DefaultSystemMessage(const std::string& t) {
  size_t cond = std::string::npos;
  for (const char* pattern : {"loop.first and messages[0]['role'] != 'system'",
                              "loop.first and messages[0][\"role\"] != \"system\"",
                              "loop.first and messages[0].role != 'system'"}) {
    cond = t.find(pattern);
    if (cond != std::string::npos) break;
  }
  if (cond == std::string::npos) return std::optional<std::string>();
  const size_t end_if = t.find("endif", cond);
  const std::string header = std::string(kImStart) + "system";
  size_t start = t.find(header, cond);
  if (start == std::string::npos || start > end_if) {
    return InvalidArgument("chat template has a default-system branch without '" + header + "'");
  }
  start += header.size();
  if (t.compare(start, 1, "\n") == 0) {
    start += 1;
  } else if (t.compare(start, 2, "\\n") == 0) {
    start += 2;
  } else {
    return InvalidArgument("chat template: expected a newline after '" + header + "'");
  }
  const size_t stop = t.find(kImEnd, start);
  if (stop == std::string::npos || stop > end_if) {
    return InvalidArgument("chat template: default system message is not closed by <|im_end|>");
  }
  return std::optional<std::string>(
      UnescapeJinjaLiteral(std::string_view(t).substr(start, stop - start)));
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Detect(const std::string& template_text) {
  if (template_text.empty()) return InvalidArgument("chat template is empty");
  if (template_text.find(kImStart) != std::string::npos) {
    TANDEM_ASSIGN_OR_RETURN(auto default_system, DefaultSystemMessage(template_text));
    return ChatTemplate(Kind::kChatML, std::move(default_system));
  }
  std::string head = template_text.substr(0, 60);
  for (char& c : head) {
    if (c == '\n') c = ' ';
  }
  return InvalidArgument("unrecognised chat template (only ChatML is supported): \"" + head +
                         (template_text.size() > 60 ? "...\"" : "\""));
}

namespace {

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

}  // namespace

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  if (kind_ == Kind::kGemma) return ApplyGemma(messages, add_generation_prompt);
  std::string out;
  auto append = [&out](std::string_view role, std::string_view content) {
    out.append(kImStart).append(role).append("\n").append(content).append(kImEnd).append("\n");
  };
  if (default_system_ && !messages.empty() && messages[0].role != "system") {
    append("system", *default_system_);
  }
  for (const ChatMessage& m : messages) append(m.role, m.content);
  if (add_generation_prompt) out.append(kImStart).append("assistant\n");
  return out;
}

}  // namespace tandem::model
