#include "jinja/template.h"

#include <cmath>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/parser.h"

namespace tandem::jinja {
namespace {

using Kind = Value::Kind;

enum class Flow { kNormal, kBreak, kContinue };

constexpr int kMaxCallDepth = 64;              // macros calling macros
constexpr size_t kMaxOutputBytes = 64u << 20;  // a runaway template stops here
constexpr int64_t kMaxSteps = 2'000'000;       // statements and loop turns of one render

Status UndefinedError(const Value& v) {
  return InvalidArgument("'" + (v.undefined_name().empty() ? "value" : v.undefined_name()) +
                         "' is undefined");
}

Status TypeError(const std::string& op, const Value& a, const Value& b) {
  return InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                         "' and '" + b.TypeName() + "'");
}

// Python's // and % on integers round toward negative infinity.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    const bool ints = a.kind() != Kind::kFloat && b.kind() != Kind::kFloat;
    if ((op == "/" || op == "//" || op == "%") && b.as_float() == 0) {
      return InvalidArgument("division by zero");
    }
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "//") return Value(FloorDiv(x, y));
      if (op == "%") return Value(x - FloorDiv(x, y) * y);
      if (op == "**" && y >= 0) return Value(static_cast<int64_t>(std::pow(x, y)));
    }
    const double x = a.as_float(), y = b.as_float();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "/") return Value(x / y);
    if (op == "//") return Value(std::floor(x / y));
    if (op == "%") return Value(x - std::floor(x / y) * y);
    if (op == "**") return Value(std::pow(x, y));
  }
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.str() + b.str());
  if (op == "+" && a.is_list() && b.is_list()) {
    List out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == Kind::kInt) {
    if (b.as_int() > 1000000) return InvalidArgument("repetition too large");
    if (a.is_string()) {
      std::string out;
      for (int64_t i = 0; i < b.as_int(); ++i) out += a.str();
      return Value(std::move(out));
    }
    List out;
    for (int64_t i = 0; i < b.as_int(); ++i)
      out.insert(out.end(), a.list().begin(), a.list().end());
    return Value(std::move(out));
  }
  return TypeError(op, a, b);
}

StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument("'in <string>' requires string as left operand, not " +
                               item.TypeName());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Kind::kDict: return item.is_string() && container.dict()->Find(item.str()) != nullptr;
    case Kind::kUndefined: return false;
    default:
      return InvalidArgument("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

// Python's index normalisation for a sequence of `size`.
int64_t Normalise(int64_t i, int64_t size) { return i < 0 ? i + size : i; }

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& context) {
    scopes_.emplace_back();
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) scopes_[0][k] = Value::FromJson(v);
    }
    scopes_.emplace_back();  // the template's own top level
  }

  StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const NodePtr& n : body) {
      TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecNode(*n, out));
      if (flow != Flow::kNormal) return flow;
      if (out->size() > kMaxOutputBytes) return InvalidArgument("template output too large");
    }
    return Flow::kNormal;
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  Status At(const Status& s, int line) const {
    if (s.ok() || s.message().rfind("line ", 0) == 0) return s;
    return Status(s.code(), "line " + std::to_string(line) + ": " + s.message());
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (auto g = GlobalFunction(name)) return *g;
    return Value::MakeUndefined(name);
  }

  Status Assign(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return OkStatus();
    }
    if (!v.is_list() || v.list().size() != targets.size()) {
      return InvalidArgument("cannot unpack " + v.TypeName() + " into " +
                             std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = v.list()[i];
    return OkStatus();
  }

  StatusOr<Flow> ExecNode(const Node& n, std::string* out) {
    if (++steps_ > kMaxSteps) return InvalidArgument("template runs too long");
    switch (n.kind) {
      case Node::Kind::kText: out->append(n.text); return Flow::kNormal;
      case Node::Kind::kOutput: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return At(v.status(), n.line);
        out->append(v->ToString());
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = cond == nullptr;
          if (!take) {
            auto v = Eval(*cond);
            if (!v.ok()) return At(v.status(), n.line);
            take = v->Truthy();
          }
          if (take) return Exec(body, out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor: return ExecFor(n, out);
      case Node::Kind::kSet: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return At(v.status(), n.line);
        if (!n.attr_of.empty()) {
          const Value ns = Lookup(n.attr_of);
          if (!ns.is_dict() || !ns.dict()->is_namespace) {
            return At(
                InvalidArgument("can only assign attributes of a namespace ('" + n.attr_of + "')"),
                n.line);
          }
          ns.dict()->Set(n.targets[0], *v);
          return Flow::kNormal;
        }
        TANDEM_RETURN_IF_ERROR(At(Assign(n.targets, *v), n.line));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        TANDEM_RETURN_IF_ERROR(Exec(n.body, &captured).status());
        scopes_.back()[n.targets[0]] = Value(std::move(captured));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: scopes_.back()[n.name] = MakeMacro(n); return Flow::kNormal;
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kFilterBlock: {
        std::string captured;
        TANDEM_RETURN_IF_ERROR(Exec(n.body, &captured).status());
        auto v = ApplyFilterChain(*n.expr, Value(std::move(captured)));
        if (!v.ok()) return At(v.status(), n.line);
        out->append(v->ToString());
        return Flow::kNormal;
      }
      case Node::Kind::kScope: {
        scopes_.emplace_back();
        auto flow = Exec(n.body, out);
        scopes_.pop_back();
        return flow;
      }
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> ExecFor(const Node& n, std::string* out) {
    auto iterable = Eval(*n.expr);
    if (!iterable.ok()) return At(iterable.status(), n.line);
    Args none;
    auto all = ApplyFilter("list", *iterable, none);
    if (!all.ok()) return At(all.status(), n.line);
    List items;
    for (const Value& item : all->list()) {
      if (n.condition == nullptr) {
        items.push_back(item);
        continue;
      }
      scopes_.emplace_back();
      Status st = Assign(n.targets, item);
      StatusOr<Value> keep = st.ok() ? Eval(*n.condition) : StatusOr<Value>(st);
      scopes_.pop_back();
      if (!keep.ok()) return At(keep.status(), n.line);
      if (keep->Truthy()) items.push_back(item);
    }
    if (items.empty()) return Exec(n.else_body, out);
    const int64_t length = static_cast<int64_t>(items.size());
    auto turn = std::make_shared<int64_t>(0);  // loop.cycle's view of the current turn
    const Value cycle(std::make_shared<Callable>(
        Callable{"loop.cycle", [turn](Args& a) -> StatusOr<Value> {
                   if (a.positional.empty()) return InvalidArgument("loop.cycle: no items");
                   return a.positional[static_cast<size_t>(*turn) % a.positional.size()];
                 }}));
    for (int64_t i = 0; i < length; ++i) {
      *turn = i;
      if (++steps_ > kMaxSteps) return InvalidArgument("template runs too long");
      scopes_.emplace_back();
      Status st = Assign(n.targets, items[i]);
      if (!st.ok()) {
        scopes_.pop_back();
        return At(st, n.line);
      }
      auto loop = std::make_shared<Dict>();
      loop->Set("index", Value(i + 1));
      loop->Set("index0", Value(i));
      loop->Set("revindex", Value(length - i));
      loop->Set("revindex0", Value(length - i - 1));
      loop->Set("first", Value(i == 0));
      loop->Set("last", Value(i == length - 1));
      loop->Set("length", Value(length));
      loop->Set("depth", Value(1));
      loop->Set("depth0", Value(0));
      loop->Set("previtem", i > 0 ? items[i - 1] : Value::MakeUndefined("loop.previtem"));
      loop->Set("nextitem", i + 1 < length ? items[i + 1] : Value::MakeUndefined("loop.nextitem"));
      loop->Set("cycle", cycle);
      scopes_.back()["loop"] = Value(std::move(loop));
      auto flow = Exec(n.body, out);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& n) {
    const Node* node = &n;
    return Value(std::make_shared<Callable>(
        Callable{n.name, [this, node](Args& a) -> StatusOr<Value> {
                   if (depth_ >= kMaxCallDepth) return InvalidArgument("macros nested too deep");
                   if (a.positional.size() > node->params.size()) {
                     return InvalidArgument("macro '" + node->name + "' takes " +
                                            std::to_string(node->params.size()) + " arguments");
                   }
                   // The macro sees the template's top level at call time and its own arguments.
                   std::vector<Scope> saved(scopes_.begin() + 2, scopes_.end());
                   scopes_.resize(2);
                   scopes_.emplace_back();
                   Status st;
                   for (size_t p = 0; p < node->params.size() && st.ok(); ++p) {
                     const auto& [pname, def] = node->params[p];
                     Value v = Value::MakeUndefined(pname);
                     if (p < a.positional.size()) {
                       v = a.positional[p];
                     } else {
                       bool given = false;
                       for (const auto& [k, kv] : a.keyword) {
                         if (k == pname) {
                           v = kv;
                           given = true;
                         }
                       }
                       if (!given && def != nullptr) {
                         auto d = Eval(*def);
                         if (!d.ok())
                           st = d.status();
                         else
                           v = *d;
                       }
                     }
                     scopes_.back()[pname] = v;
                   }
                   std::string out;
                   ++depth_;
                   if (st.ok()) st = Exec(node->body, &out).status();
                   --depth_;
                   scopes_.resize(2);
                   scopes_.insert(scopes_.end(), saved.begin(), saved.end());
                   if (!st.ok()) return st;
                   return Value(std::move(out));
                 }}));
  }

  StatusOr<Args> EvalArgs(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.children.size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*x));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  // Applies a filter expression's chain to `operand` (the chain's innermost operand is null).
  StatusOr<Value> ApplyFilterChain(const Expr& e, Value operand) {
    if (e.children[0] != nullptr) {
      TANDEM_ASSIGN_OR_RETURN(operand, ApplyFilterChain(*e.children[0], std::move(operand)));
    }
    TANDEM_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    return ApplyFilter(e.name, operand, args);
  }

  StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) return UndefinedError(obj);
    if (auto m = BoundMethod(obj, name)) return *m;
    if (obj.is_dict()) {
      const Value* f = obj.dict()->Find(name);
      return f ? *f : Value::MakeUndefined(name);
    }
    return Value::MakeUndefined(name);
  }

  StatusOr<Value> GetItem(const Value& obj, const Value& key) {
    if (obj.is_undefined()) return UndefinedError(obj);
    if (obj.is_dict() && key.is_string()) {
      const Value* f = obj.dict()->Find(key.str());
      if (f) return *f;
      return GetAttr(obj, key.str());
    }
    if ((obj.is_list() || obj.is_string()) &&
        (key.kind() == Kind::kInt || key.kind() == Kind::kBool)) {
      if (obj.is_list()) {
        const int64_t i = Normalise(key.as_int(), static_cast<int64_t>(obj.list().size()));
        if (i >= 0 && i < static_cast<int64_t>(obj.list().size()))
          return obj.list()[static_cast<size_t>(i)];
      } else {
        const std::vector<std::string> cps = CodePoints(obj.str());
        const int64_t i = Normalise(key.as_int(), static_cast<int64_t>(cps.size()));
        if (i >= 0 && i < static_cast<int64_t>(cps.size()))
          return Value(cps[static_cast<size_t>(i)]);
      }
      return Value::MakeUndefined("[" + std::to_string(key.as_int()) + "]");
    }
    if (key.is_string()) return GetAttr(obj, key.str());
    return Value::MakeUndefined(key.ToString());
  }

  StatusOr<Value> Slice(const Value& obj, const Expr& e) {
    if (obj.is_undefined()) return UndefinedError(obj);
    List items;
    if (obj.is_string()) {
      for (std::string& c : CodePoints(obj.str())) items.emplace_back(std::move(c));
    } else if (obj.is_list()) {
      items = obj.list();
    } else {
      return InvalidArgument("'" + obj.TypeName() + "' object is not subscriptable");
    }
    int64_t part[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (e.children[static_cast<size_t>(k) + 1] == nullptr) continue;
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.children[static_cast<size_t>(k) + 1]));
      if (v.is_none()) continue;
      if (v.kind() != Kind::kInt && v.kind() != Kind::kBool)
        return InvalidArgument("slice indices must be integers");
      part[k] = v.as_int();
      given[k] = true;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t step = part[2];
    if (step == 0) return InvalidArgument("slice step cannot be zero");
    // Python's slice.indices.
    auto clamp = [&](int64_t i, bool is_given, int64_t dflt) {
      if (!is_given) return dflt;
      if (i < 0) i += n;
      if (step > 0) return std::clamp<int64_t>(i, 0, n);
      return std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t start = clamp(part[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], given[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      out.push_back(items[static_cast<size_t>(i)]);
    if (obj.is_string()) {
      std::string s;
      for (const Value& c : out) s += c.str();
      return Value(std::move(s));
    }
    return Value(std::move(out));
  }

  StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: {
        List out;
        for (const ExprPtr& c : e.children) {
          TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*c));
          out.push_back(std::move(v));
        }
        return Value(std::move(out));
      }
      case Expr::Kind::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          TANDEM_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i]));
          TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1]));
          if (!k.is_string()) return InvalidArgument("dict keys must be strings here");
          d->Set(k.str(), std::move(v));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        TANDEM_ASSIGN_OR_RETURN(Value key, Eval(*e.children[1]));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return Slice(obj, e);
      }
      case Expr::Kind::kCall: {
        TANDEM_ASSIGN_OR_RETURN(Value f, Eval(*e.children[0]));
        if (f.is_undefined()) return UndefinedError(f);
        if (f.kind() != Kind::kCallable)
          return InvalidArgument("'" + f.TypeName() + "' object is not callable");
        TANDEM_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return f.callable()->call(args);
      }
      case Expr::Kind::kFilter: {
        TANDEM_ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0]));
        TANDEM_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
        TANDEM_ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0]));
        TANDEM_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        TANDEM_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, operand, args));
        return Value(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        if (e.name == "not") return Value(!v.Truthy());
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number())
          return InvalidArgument("bad operand type for unary " + e.name + ": '" + v.TypeName() +
                                 "'");
        if (e.name == "+") return v.kind() == Kind::kBool ? Value(v.as_int()) : v;
        return v.kind() == Kind::kFloat ? Value(-v.as_float()) : Value(-v.as_int());
      }
      case Expr::Kind::kBinary: return EvalBinary(e);
      case Expr::Kind::kCondition: {
        TANDEM_ASSIGN_OR_RETURN(Value cond, Eval(*e.children[1]));
        if (cond.Truthy()) return Eval(*e.children[0]);
        if (e.children[2] == nullptr) return Value::MakeUndefined("conditional expression");
        return Eval(*e.children[2]);
      }
    }
    return InvalidArgument("unknown expression");
  }

  StatusOr<Value> EvalBinary(const Expr& e) {
    TANDEM_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
    if (e.name == "and") return a.Truthy() ? Eval(*e.children[1]) : a;
    if (e.name == "or") return a.Truthy() ? a : Eval(*e.children[1]);
    TANDEM_ASSIGN_OR_RETURN(Value b, Eval(*e.children[1]));
    if (e.name == "~") return Value(a.ToString() + b.ToString());
    if (e.name == "==") return Value(Equal(a, b));
    if (e.name == "!=") return Value(!Equal(a, b));
    if (e.name == "in" || e.name == "not in") {
      TANDEM_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return Value(in == (e.name == "in"));
    }
    if (e.name == "<" || e.name == ">" || e.name == "<=" || e.name == ">=") {
      if (a.is_undefined()) return UndefinedError(a);
      if (b.is_undefined()) return UndefinedError(b);
      TANDEM_ASSIGN_OR_RETURN(int c, Compare(a, b));
      if (e.name == "<") return Value(c < 0);
      if (e.name == ">") return Value(c > 0);
      if (e.name == "<=") return Value(c <= 0);
      return Value(c >= 0);
    }
    return Arithmetic(e.name, a, b);
  }

  std::vector<Scope> scopes_;  // [0]: the context, [1]: the template's top level, then blocks
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

StatusOr<Template> Template::Parse(std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  TANDEM_ASSIGN_OR_RETURN(Parsed parsed, jinja::Parse(tokens));
  return Template(std::make_shared<const Parsed>(std::move(parsed)));
}

StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  Renderer renderer(context);
  std::string out;
  TANDEM_RETURN_IF_ERROR(renderer.Exec(parsed_->body, &out).status());
  return out;
}

bool Template::Reads(const std::string& name) const { return parsed_->names.count(name) > 0; }

}  // namespace tandem::jinja
