// The chat template: parsing a template text with the Jinja renderer (ChatTemplate::Parse) and
// rendering messages with it, with SmolLM2's ChatML template and with Gemma's format.
// Input: NUL-separated fields: template text, then (role, content) pairs.
// Properties: no crash, hang or sanitizer report for any template text (a bad one is refused or
// its render fails with a Status); with SmolLM2's template and Gemma's format every message's
// content appears in the rendering (ChatML verbatim; Gemma trims surrounding whitespace and, as
// llama.cpp, folds a leading system message into the next turn, so a system message alone
// renders nothing) and a generation prompt ends the text with the assistant's header.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/chat_template.h"

namespace {

using namespace tandem;

std::string_view TrimWs(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// SmolLM2-135M-Instruct's template, as its GGUF file holds it.
const char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";
const model::ChatTemplate kGemma = model::ChatTemplate::Gemma();

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> fields;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (;;) {
    const size_t nul = in.find('\0');
    fields.emplace_back(in.substr(0, nul));
    if (nul == std::string_view::npos) break;
    in.remove_prefix(nul + 1);
  }
  std::vector<model::ChatMessage> messages;
  for (size_t i = 1; i + 1 < fields.size() && messages.size() < 16; i += 2) {
    messages.push_back({fields[i], fields[i + 1]});
  }
  if (auto fuzzed = model::ChatTemplate::Parse(fields[0], "<s>", "</s>"); fuzzed.ok()) {
    (void)fuzzed->Apply(messages, /*add_generation_prompt=*/true);
  }
  static const model::ChatTemplate smollm2 = model::ChatTemplate::Parse(kSmolLm2Template).value();
  for (const model::ChatTemplate* t : {&smollm2, &kGemma}) {
    auto rendered = t->Apply(messages, /*add_generation_prompt=*/true);
    TANDEM_FUZZ_CHECK(rendered.ok());
    const std::string& text = *rendered;
    const bool gemma = t->kind() == model::ChatTemplate::Kind::kGemma;
    for (size_t i = 0; i < messages.size(); ++i) {
      const model::ChatMessage& m = messages[i];
      if (gemma && i == 0 && m.role == "system" && messages.size() == 1) continue;
      const std::string_view content = gemma ? TrimWs(m.content) : m.content;
      TANDEM_FUZZ_CHECK(text.find(content) != std::string::npos);
    }
    const std::string_view header = gemma ? "<start_of_turn>model\n" : "<|im_start|>assistant\n";
    TANDEM_FUZZ_CHECK(std::string_view(text).ends_with(header));
  }
  return 0;
}
