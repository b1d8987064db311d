// Chat formatting: the model's own Jinja chat template (tokenizer.chat_template of the GGUF
// file, rendered by src/jinja as Hugging Face's apply_chat_template renders it), or Gemma's
// turn format for Gemma 3 files that carry none.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::jinja {
class Template;
}

namespace tandem::model {

// One function call of an assistant message (OpenAI's tool_calls entry).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;  // a JSON object
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};  // assistant: the calls it made
  std::string tool_call_id = {};              // tool: the call this answers
};

class ChatTemplate {
 public:
  enum class Kind { kJinja, kGemma };

  // Parses a Jinja template (a syntax error is kInvalidArgument naming its line). bos_token and
  // eos_token are the texts the template sees under those names; when the tokenizer adds BOS
  // itself (tokenizer_adds_bos), a BOS text the template starts with is dropped so that the
  // prompt does not begin with two.
  static StatusOr<ChatTemplate> Parse(const std::string& template_text, std::string bos_token = "",
                                      std::string eos_token = "", bool tokenizer_adds_bos = false);
  // Gemma's turn format, for Gemma 3 files without a template (the 270M base model has none),
  // as the instruction-tuned Gemma 3 models' template and llama.cpp's "gemma" format render it:
  // "<start_of_turn>user\n" + content + "<end_of_turn>\n" per turn, "model" for the assistant,
  // the system message (if first) prefixed to the first user turn with a blank line, contents
  // trimmed, "<start_of_turn>model\n" as the generation prompt. BOS is the tokenizer's.
  static ChatTemplate Gemma();

  // Renders messages; with add_generation_prompt the text ends with the assistant header.
  // tools_json: the offered tools as OpenAI's "tools" array (JSON text), empty for none; the
  // template sees it as `tools` (only templates that read_tools() use it). A template's own
  // refusal (raise_exception) or error is kInvalidArgument with its message.
  StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                              const std::string& tools_json = "") const;

  // Whether the template renders tools itself (reads a variable named `tools`).
  bool reads_tools() const;
  Kind kind() const { return kind_; }
  // The Jinja text it was parsed from (empty for Gemma()).
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  Kind kind_ = Kind::kGemma;
  std::shared_ptr<const jinja::Template> jinja_;  // kJinja; immutable, shared by copies
  std::string source_;
  std::string bos_token_, eos_token_;
  bool strip_leading_bos_ = false;
};

}  // namespace tandem::model
