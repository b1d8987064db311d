// Splits template source into text and tags, applying jinja2's whitespace control with the
// settings chat templates are rendered with (trim_blocks and lstrip_blocks on, the source's
// final newline dropped), and the inside of each tag into expression tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::jinja {

struct Token {
  enum class Kind {
    kText,        // text: literal output
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifiers and keywords (and, or, not, in, is, if, else, ...)
    kString,      // text: the literal's value, escapes resolved
    kInt,         // text: the digits
    kFloat,       // text: the literal
    kOp,          // text: one of ( ) [ ] { } , . : | + - * / // % ** ~ == != < > <= >= =
  };
  Kind kind;
  std::string text;
  int line;  // 1-based, where the token starts
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Tokens of the whole template: text tokens between tags, each tag as its begin token, its
// expression tokens and its end token. Comments and raw blocks are resolved here.
StatusOr<std::vector<Token>> Lex(std::string_view source, const LexOptions& options = {});

}  // namespace tandem::jinja
