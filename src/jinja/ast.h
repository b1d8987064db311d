// The parsed template: expressions and statements. Built once by the parser, then read-only
// (shared by every render, from any thread).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // children: the elements (tuples are lists)
    kDict,      // children: key, value, key, value, ...
    kGetAttr,   // children[0].name
    kGetItem,   // children[0][children[1]]
    kSlice,     // children[0][children[1]:children[2]:children[3]], absent parts null
    kCall,      // children[0](children[1..], kwargs)
    kFilter,    // children[0] | name(children[1..], kwargs)
    kTest,      // children[0] is [not] name(children[1..])
    kUnary,     // name ("-", "+", "not") children[0]
    kBinary,    // children[0] name children[1]; name: + - * / // % ** ~ == != < > <= >= in
                // "not in", "and", "or"
    kCondition  // children[0] if children[1] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body), a null condition is the else
    kFor,       // for targets in expr [if condition]: body [else else_body]
    kSet,       // set targets = expr; set attr_of.name = expr when attr_of is not empty
    kSetBlock,  // set targets[0]: body rendered into a string
    kMacro,     // macro name(params): body
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr (a kFilter whose operand is null): body
    kScope,        // body in its own scope (generation blocks: rendered as they are)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr_of;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null: required
  Body body;
  Body else_body;
};

}  // namespace tandem::jinja
