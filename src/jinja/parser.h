// Parses a token stream into statements, with jinja2's grammar and operator precedence
// (or < and < not < comparisons < + - < ~ < * / // % < ** < unary minus < filters, tests and
// calls < attribute and item access).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace tandem::jinja {

struct Parsed {
  Body body;
  std::set<std::string> names;  // every variable name the template reads
};

StatusOr<Parsed> Parse(const std::vector<Token>& tokens);

}  // namespace tandem::jinja
