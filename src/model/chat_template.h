// Chat formatting for the templates tandem recognises in tokenizer.chat_template.
// Unknown templates are refused with a clear error naming what was found.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatML };

  // Recognises the template text from GGUF metadata. The SmolLM2 variant of ChatML (which adds
  // a default system message when the first message is not "system") is detected as such.
  static StatusOr<ChatTemplate> Detect(const std::string& template_text);

  // Renders messages; with add_generation_prompt the text ends with the assistant header.
  std::string Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  Kind kind() const { return kind_; }

 private:
  ChatTemplate(Kind kind, std::optional<std::string> default_system)
      : kind_(kind), default_system_(std::move(default_system)) {}
  Kind kind_;
  // Inserted as a system message when the first message is not "system"; nullopt: never.
  std::optional<std::string> default_system_;
};

}  // namespace tandem::model
