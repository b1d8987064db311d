// A Jinja template renderer for chat templates (the `tokenizer.chat_template` of GGUF files):
// the part of jinja2 that chat templates use, rendered as Hugging Face's apply_chat_template
// renders them (jinja2's immutable sandbox, trim_blocks and lstrip_blocks on, the loopcontrols
// extension, the globals raise_exception and strftime_now, tojson as json.dumps without
// sorting keys or escaping non-ASCII). Output equals jinja2's on the cases of
// tests/golden/jinja (src/jinja/template_test.cc).
//
// Supported: text, {{ }}, {% %} and {# #} with "-" / "+" whitespace control; if / elif / else,
// for (tuple targets, an "if" filter, else, loop.*, break, continue), set (also of a namespace
// attribute, and the block form), macro, filter blocks, raw, generation; literals, lists,
// dicts, attribute and item access, slices, calls with keyword arguments, filters, tests, the
// arithmetic, comparison, "in", "~" and logical operators, conditional expressions.
// Not supported (a clear error at parse time): call blocks, recursive loops, include, import,
// extends and blocks.
//
// Thread-safety: a Template is immutable after Parse; Render may run on many threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem::jinja {

struct Parsed;

class Template {
 public:
  // A syntax error is kInvalidArgument naming its line.
  static StatusOr<Template> Parse(std::string_view source);

  // Renders with the variables of `context` (a JSON object; key order is kept). Errors of the
  // template (raise_exception, an undefined value used, a type error) are kInvalidArgument.
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  // Whether the template reads a variable so named anywhere (e.g. "tools").
  bool Reads(const std::string& name) const;

 private:
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace tandem::jinja
