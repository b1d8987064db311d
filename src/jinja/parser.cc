#include "jinja/parser.h"

#include <cstdlib>

namespace tandem::jinja {
namespace {

using TK = Token::Kind;

std::shared_ptr<Expr> NewExpr(Expr::Kind kind, int line) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  StatusOr<Parsed> Run() {
    Parsed out;
    std::string stopped_at;
    TANDEM_RETURN_IF_ERROR(ParseBody({}, &out.body, &stopped_at));
    out.names = std::move(names_);
    return out;
  }

 private:
  bool AtEnd() const { return i_ >= t_.size(); }
  const Token& Peek(size_t ahead = 0) const {
    static const Token kEnd{TK::kBlockEnd, "", 0};
    return i_ + ahead < t_.size() ? t_[i_ + ahead] : kEnd;
  }
  int Line() const { return AtEnd() ? (t_.empty() ? 1 : t_.back().line) : Peek().line; }
  Status Error(const std::string& what) const {
    return InvalidArgument("template syntax error at line " + std::to_string(Line()) + ": " + what);
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == TK::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == TK::kName && Peek(ahead).text == name;
  }
  bool Accept(std::string_view op) {
    if (!IsOp(op)) return false;
    ++i_;
    return true;
  }
  bool AcceptName(std::string_view name) {
    if (!IsName(name)) return false;
    ++i_;
    return true;
  }
  Status Expect(std::string_view op) {
    if (Accept(op)) return OkStatus();
    return Error("expected '" + std::string(op) + "', found '" + Peek().text + "'");
  }
  Status ExpectKind(TK kind, const char* what) {
    if (AtEnd() || Peek().kind != kind) return Error(std::string("expected ") + what);
    ++i_;
    return OkStatus();
  }
  StatusOr<std::string> ExpectIdentifier() {
    if (Peek().kind != TK::kName) return Error("expected a name, found '" + Peek().text + "'");
    return t_[i_++].text;
  }

  // Statements until a block tag named in `stops` (consumed up to its name; its name is
  // returned in *stopped_at) or the end of the tokens (only allowed when stops is empty).
  Status ParseBody(const std::vector<std::string>& stops, Body* body, std::string* stopped_at) {
    while (!AtEnd()) {
      const Token& tok = Peek();
      if (tok.kind == TK::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kText;
        n->text = tok.text;
        n->line = tok.line;
        body->push_back(n);
        ++i_;
      } else if (tok.kind == TK::kVarBegin) {
        ++i_;
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tok.line;
        TANDEM_ASSIGN_OR_RETURN(n->expr, ParseTuple(true));
        TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kVarEnd, "'}}'"));
        body->push_back(n);
      } else if (tok.kind == TK::kBlockBegin) {
        ++i_;
        TANDEM_ASSIGN_OR_RETURN(std::string keyword, ExpectIdentifier());
        for (const std::string& s : stops) {
          if (keyword == s) {
            *stopped_at = keyword;
            return OkStatus();
          }
        }
        TANDEM_ASSIGN_OR_RETURN(NodePtr n, ParseStatement(keyword, tok.line));
        body->push_back(std::move(n));
      } else {
        return Error("unexpected '" + tok.text + "'");
      }
    }
    if (!stops.empty()) return Error("missing '{% " + stops.front() + " %}'");
    return OkStatus();
  }

  StatusOr<NodePtr> ParseStatement(const std::string& keyword, int line) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("blocks nested too deep");
    auto n = std::make_shared<Node>();
    n->line = line;
    std::string stop;
    if (keyword == "if") {
      n->kind = Node::Kind::kIf;
      std::string next = "elif";
      ExprPtr cond;
      TANDEM_ASSIGN_OR_RETURN(cond, ParseTuple(true));
      while (true) {
        TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
        Body body;
        TANDEM_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &stop));
        n->branches.emplace_back(cond, std::move(body));
        if (stop == "endif") break;
        if (cond == nullptr) return Error("'" + stop + "' after 'else'");
        if (stop == "elif") {
          TANDEM_ASSIGN_OR_RETURN(cond, ParseTuple(true));
        } else {
          cond = nullptr;
        }
      }
    } else if (keyword == "for") {
      n->kind = Node::Kind::kFor;
      do {
        TANDEM_ASSIGN_OR_RETURN(std::string target, ExpectIdentifier());
        n->targets.push_back(std::move(target));
      } while (Accept(","));
      if (!AcceptName("in")) return Error("expected 'in' in a for loop");
      TANDEM_ASSIGN_OR_RETURN(n->expr, ParseTuple(false));
      if (AcceptName("if")) {
        TANDEM_ASSIGN_OR_RETURN(n->condition, ParseExpression(true));
      }
      if (AcceptName("recursive")) return Error("recursive loops are not supported");
      TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n->body, &stop));
      if (stop == "else") {
        TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
        TANDEM_RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &stop));
      }
    } else if (keyword == "set") {
      TANDEM_ASSIGN_OR_RETURN(std::string first, ExpectIdentifier());
      if (Accept(".")) {
        n->attr_of = first;
        names_.insert(first);
        TANDEM_ASSIGN_OR_RETURN(first, ExpectIdentifier());
      }
      n->targets.push_back(first);
      while (n->attr_of.empty() && Accept(",")) {
        TANDEM_ASSIGN_OR_RETURN(std::string target, ExpectIdentifier());
        n->targets.push_back(std::move(target));
      }
      if (Accept("=")) {
        n->kind = Node::Kind::kSet;
        TANDEM_ASSIGN_OR_RETURN(n->expr, ParseTuple(true));
      } else {
        if (!n->attr_of.empty() || n->targets.size() != 1) return Error("expected '='");
        n->kind = Node::Kind::kSetBlock;
        TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
        TANDEM_RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &stop));
      }
    } else if (keyword == "macro") {
      n->kind = Node::Kind::kMacro;
      TANDEM_ASSIGN_OR_RETURN(n->name, ExpectIdentifier());
      TANDEM_RETURN_IF_ERROR(Expect("("));
      while (!Accept(")")) {
        if (!n->params.empty()) TANDEM_RETURN_IF_ERROR(Expect(","));
        if (Accept(")")) break;
        TANDEM_ASSIGN_OR_RETURN(std::string param, ExpectIdentifier());
        ExprPtr def;
        if (Accept("=")) {
          TANDEM_ASSIGN_OR_RETURN(def, ParseExpression(true));
        }
        n->params.emplace_back(std::move(param), std::move(def));
      }
      TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(ParseBody({"endmacro"}, &n->body, &stop));
    } else if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    } else if (keyword == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      TANDEM_ASSIGN_OR_RETURN(n->expr, ParseFilter(nullptr));
      TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(ParseBody({"endfilter"}, &n->body, &stop));
    } else if (keyword == "generation") {
      n->kind = Node::Kind::kScope;
      TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
      TANDEM_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n->body, &stop));
    } else {
      return Error("unknown tag '" + keyword + "'");
    }
    TANDEM_RETURN_IF_ERROR(ExpectKind(TK::kBlockEnd, "'%}'"));
    return NodePtr(std::move(n));
  }

  // expr [, expr ...]: a tuple (a list here) when there is a comma.
  StatusOr<ExprPtr> ParseTuple(bool with_condition) {
    const int line = Line();
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_condition));
    if (!IsOp(",")) return first;
    auto list = NewExpr(Expr::Kind::kList, line);
    list->children.push_back(first);
    while (Accept(",")) {
      if (Peek().kind == TK::kBlockEnd || Peek().kind == TK::kVarEnd || IsOp(")")) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condition));
      list->children.push_back(e);
    }
    return ExprPtr(list);
  }

  // Nesting (brackets, unary chains, blocks in blocks) is bounded, so that a hostile template
  // cannot exhaust the stack of the parser or of the renderer that walks its tree.
  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  static constexpr int kMaxDepth = 100;

  StatusOr<ExprPtr> ParseExpression(bool with_condition) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deep");
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    if (!with_condition) return e;
    while (IsName("if")) {
      const int line = Line();
      ++i_;
      auto c = NewExpr(Expr::Kind::kCondition, line);
      c->children.push_back(e);
      TANDEM_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      c->children.push_back(cond);
      ExprPtr other;
      if (AcceptName("else")) {
        TANDEM_ASSIGN_OR_RETURN(other, ParseExpression(true));
      }
      c->children.push_back(other);
      e = c;
    }
    return e;
  }

  StatusOr<ExprPtr> Binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto b = NewExpr(Expr::Kind::kBinary, line);
    b->name = op;
    b->children = {std::move(left), std::move(right)};
    return ExprPtr(b);
  }

  StatusOr<ExprPtr> ParseOr() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      const int line = Line();
      ++i_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      TANDEM_ASSIGN_OR_RETURN(e, Binary("or", e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseAnd() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      const int line = Line();
      ++i_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      TANDEM_ASSIGN_OR_RETURN(e, Binary("and", e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseNot() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deep");
    if (IsName("not")) {
      const int line = Line();
      ++i_;
      auto u = NewExpr(Expr::Kind::kUnary, line);
      u->name = "not";
      TANDEM_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      u->children.push_back(operand);
      return ExprPtr(u);
    }
    return ParseCompare();
  }

  StatusOr<ExprPtr> ParseCompare() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    // a < b < c chains as (a < b) and (b < c) in jinja2; templates do not chain, so pairs.
    while (true) {
      const int line = Line();
      std::string op;
      if (Peek().kind == TK::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = t_[i_++].text;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      TANDEM_ASSIGN_OR_RETURN(e, Binary(op, e, r, line));
    }
  }

  StatusOr<ExprPtr> ParseMath1() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const int line = Line();
      const std::string op = t_[i_++].text;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      TANDEM_ASSIGN_OR_RETURN(e, Binary(op, e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseConcat() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
    while (IsOp("~")) {
      const int line = Line();
      ++i_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      TANDEM_ASSIGN_OR_RETURN(e, Binary("~", e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseMath2() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const int line = Line();
      const std::string op = t_[i_++].text;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      TANDEM_ASSIGN_OR_RETURN(e, Binary(op, e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParsePow() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(true));
    while (IsOp("**")) {
      const int line = Line();
      ++i_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
      TANDEM_ASSIGN_OR_RETURN(e, Binary("**", e, r, line));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deep");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      auto u = NewExpr(Expr::Kind::kUnary, Line());
      u->name = t_[i_++].text;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      u->children.push_back(operand);
      e = u;
    } else {
      TANDEM_ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    TANDEM_ASSIGN_OR_RETURN(e, ParsePostfix(e));
    if (!with_filter) return e;
    while (true) {
      if (IsOp("|")) {
        TANDEM_ASSIGN_OR_RETURN(e, ParseFilter(e));
      } else if (IsName("is")) {
        TANDEM_ASSIGN_OR_RETURN(e, ParseTest(e));
      } else if (IsOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(e, ParseCall(e));
      } else {
        return e;
      }
    }
  }

  // | name [(args)] [| ...]; `operand` null inside a {% filter %} tag.
  StatusOr<ExprPtr> ParseFilter(ExprPtr operand) {
    bool first = true;
    while (first ? true : IsOp("|")) {
      if (!first || operand != nullptr) TANDEM_RETURN_IF_ERROR(Expect("|"));
      first = false;
      auto f = NewExpr(Expr::Kind::kFilter, Line());
      TANDEM_ASSIGN_OR_RETURN(f->name, ExpectIdentifier());
      while (Accept(".")) {
        TANDEM_ASSIGN_OR_RETURN(std::string part, ExpectIdentifier());
        f->name += "." + part;
      }
      f->children.push_back(operand);
      if (IsOp("(")) TANDEM_RETURN_IF_ERROR(ParseArgs(f.get()));
      operand = f;
    }
    return operand;
  }

  StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    const int line = Line();
    ++i_;  // is
    auto t = NewExpr(Expr::Kind::kTest, line);
    t->negated = AcceptName("not");
    TANDEM_ASSIGN_OR_RETURN(t->name, ExpectIdentifier());
    t->children.push_back(operand);
    if (IsOp("(")) {
      TANDEM_RETURN_IF_ERROR(ParseArgs(t.get()));
    } else if ((Peek().kind == TK::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                !IsName("if") && !IsName("is") && !IsName("in") && !IsName("not")) ||
               Peek().kind == TK::kString || Peek().kind == TK::kInt || Peek().kind == TK::kFloat ||
               IsOp("[") || IsOp("{")) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      TANDEM_ASSIGN_OR_RETURN(arg, ParsePostfix(arg));
      t->children.push_back(arg);
    }
    return ExprPtr(t);
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto c = NewExpr(Expr::Kind::kCall, Line());
    c->children.push_back(callee);
    TANDEM_RETURN_IF_ERROR(ParseArgs(c.get()));
    return ExprPtr(c);
  }

  // ( positional..., name=value... ) appended to e's children and kwargs.
  Status ParseArgs(Expr* e) {
    TANDEM_RETURN_IF_ERROR(Expect("("));
    bool first = true;
    while (!Accept(")")) {
      if (!first) {
        TANDEM_RETURN_IF_ERROR(Expect(","));
        if (Accept(")")) break;
      }
      first = false;
      if (Peek().kind == TK::kName && IsOp("=", 1)) {
        std::string key = t_[i_].text;
        i_ += 2;
        TANDEM_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e->kwargs.empty()) return Error("positional argument after a keyword argument");
        TANDEM_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->children.push_back(std::move(v));
      }
    }
    return OkStatus();
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++i_;
        auto g = NewExpr(Expr::Kind::kGetAttr, Line());
        if (Peek().kind == TK::kInt) {  // x.0 is x[0]
          g->kind = Expr::Kind::kGetItem;
          auto idx = NewExpr(Expr::Kind::kLiteral, Line());
          idx->literal =
              Value(static_cast<int64_t>(std::strtoll(t_[i_++].text.c_str(), nullptr, 10)));
          g->children = {e, idx};
        } else {
          TANDEM_ASSIGN_OR_RETURN(g->name, ExpectIdentifier());
          g->children.push_back(e);
        }
        e = g;
      } else if (IsOp("[")) {
        TANDEM_ASSIGN_OR_RETURN(e, ParseSubscript(e));
      } else if (IsOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(e, ParseCall(e));
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr obj) {
    const int line = Line();
    ++i_;  // [
    ExprPtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (Accept(":")) {
        if (++colons > 2) return Error("too many ':' in a slice");
        continue;
      }
      if (parts[colons] != nullptr) return Error("expected ':' or ']'");
      TANDEM_ASSIGN_OR_RETURN(parts[colons], ParseExpression(true));
    }
    ++i_;  // ]
    if (colons == 0) {
      if (parts[0] == nullptr) return Error("empty subscript");
      auto g = NewExpr(Expr::Kind::kGetItem, line);
      g->children = {obj, parts[0]};
      return ExprPtr(g);
    }
    auto s = NewExpr(Expr::Kind::kSlice, line);
    s->children = {obj, parts[0], parts[1], parts[2]};
    return ExprPtr(s);
  }

  StatusOr<ExprPtr> ParsePrimary() {
    if (AtEnd()) return Error("unexpected end of template");
    const Token& tok = Peek();
    const int line = tok.line;
    auto lit = NewExpr(Expr::Kind::kLiteral, line);
    switch (tok.kind) {
      case TK::kName: {
        ++i_;
        if (tok.text == "true" || tok.text == "True") {
          lit->literal = Value(true);
        } else if (tok.text == "false" || tok.text == "False") {
          lit->literal = Value(false);
        } else if (tok.text == "none" || tok.text == "None") {
          lit->literal = Value::None();
        } else {
          auto n = NewExpr(Expr::Kind::kName, line);
          n->name = tok.text;
          names_.insert(tok.text);
          return ExprPtr(n);
        }
        return ExprPtr(lit);
      }
      case TK::kString: {
        std::string s;
        while (Peek().kind == TK::kString) s += t_[i_++].text;  // adjacent literals join
        lit->literal = Value(std::move(s));
        return ExprPtr(lit);
      }
      case TK::kInt:
        ++i_;
        lit->literal = Value(static_cast<int64_t>(std::strtoll(tok.text.c_str(), nullptr, 10)));
        return ExprPtr(lit);
      case TK::kFloat:
        ++i_;
        lit->literal = Value(std::strtod(tok.text.c_str(), nullptr));
        return ExprPtr(lit);
      case TK::kOp:
        if (tok.text == "(") {
          ++i_;
          if (Accept(")")) {
            auto empty = NewExpr(Expr::Kind::kList, line);
            return ExprPtr(empty);
          }
          TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true));
          TANDEM_RETURN_IF_ERROR(Expect(")"));
          return e;
        }
        if (tok.text == "[") {
          ++i_;
          auto l = NewExpr(Expr::Kind::kList, line);
          while (!Accept("]")) {
            if (!l->children.empty()) {
              TANDEM_RETURN_IF_ERROR(Expect(","));
              if (Accept("]")) break;
            }
            TANDEM_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
            l->children.push_back(e);
          }
          return ExprPtr(l);
        }
        if (tok.text == "{") {
          ++i_;
          auto d = NewExpr(Expr::Kind::kDict, line);
          while (!Accept("}")) {
            if (!d->children.empty()) {
              TANDEM_RETURN_IF_ERROR(Expect(","));
              if (Accept("}")) break;
            }
            TANDEM_ASSIGN_OR_RETURN(ExprPtr k, ParseExpression(true));
            TANDEM_RETURN_IF_ERROR(Expect(":"));
            TANDEM_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
            d->children.push_back(k);
            d->children.push_back(v);
          }
          return ExprPtr(d);
        }
        break;
      default: break;
    }
    return Error("unexpected '" + tok.text + "'");
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  std::set<std::string> names_;
  int depth_ = 0;
};

}  // namespace

StatusOr<Parsed> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Run(); }

}  // namespace tandem::jinja
