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
  enum class Kind { kChatML, kGemma };

  // Recognises the template text from GGUF metadata. The SmolLM2 variant of ChatML (which adds
  // a default system message when the first message is not "system") is detected as such.
  static StatusOr<ChatTemplate> Detect(const std::string& template_text);
  // Gemma's turn format, for Gemma 3 files without a template (the 270M base model has none),
  // as the instruction-tuned Gemma 3 models' template and llama.cpp's "gemma" format render it:
  // "<start_of_turn>user\n" + content + "<end_of_turn>\n" per turn, "model" for the assistant,
  // the system message (if first) prefixed to the first user turn with a blank line, contents
  // trimmed, "<start_of_turn>model\n" as the generation prompt. BOS is the tokenizer's.
  static ChatTemplate Gemma() { return ChatTemplate(Kind::kGemma, std::nullopt); }

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
