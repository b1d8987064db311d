// The chat template: recognising a template text (ChatTemplate::Detect) and rendering messages
// with what it recognised, SmolLM2's ChatML (with its default system message) and Gemma's.
// Input: NUL-separated fields: template text, then (role, content) pairs.
// Properties: no crash or sanitizer report; every message's content appears in the rendering
// (ChatML verbatim; Gemma trims surrounding whitespace and, as llama.cpp, folds a leading
// system message into the next turn, so a system message alone renders nothing); a generation
// prompt ends the text with the assistant's header.
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
  std::vector<model::ChatTemplate> templates = {model::ChatTemplate::Gemma()};
  if (auto detected = model::ChatTemplate::Detect(fields[0]); detected.ok()) {
    templates.push_back(*detected);
  }
  for (const model::ChatTemplate& t : templates) {
    const std::string text = t.Apply(messages, /*add_generation_prompt=*/true);
    const bool gemma = t.kind() == model::ChatTemplate::Kind::kGemma;
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
