// builtins.h, first part: the filters and tests (methods.cc has the rest).
#include "jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>

#include "jinja/text.h"

namespace tandem::jinja {

using Kind = Value::Kind;

// Argument `index` (positional) or `name` (keyword); null when absent.
const Value* Arg(const Args& a, size_t index, std::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  for (const auto& [k, v] : a.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value ArgOr(const Args& a, size_t index, std::string_view name, Value fallback) {
  const Value* v = Arg(a, index, name);
  return v ? *v : std::move(fallback);
}

StatusOr<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return List();
    case Kind::kList: return v.list();
    case Kind::kDict: {
      List keys;
      for (const auto& [k, e] : v.dict()->items()) keys.emplace_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (std::string& c : CodePoints(v.str())) chars.emplace_back(std::move(c));
      return chars;
    }
    default: return InvalidArgument("'" + v.TypeName() + "' object is not iterable");
  }
}

namespace {

StatusOr<Value> Attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string part = path.substr(start, dot - start);
    if (cur.is_dict()) {
      const Value* f = cur.dict()->Find(part);
      cur = f ? *f : Value::MakeUndefined(part);
    } else if (cur.is_list() && !part.empty() &&
               std::isdigit(static_cast<unsigned char>(part[0]))) {
      const size_t i = std::stoul(part);
      cur = i < cur.list().size() ? cur.list()[i] : Value::MakeUndefined(part);
    } else {
      cur = Value::MakeUndefined(part);
    }
    start = dot + 1;
  }
  return cur;
}

StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(CodePoints(v.str()).size());
    case Kind::kList: return static_cast<int64_t>(v.list().size());
    case Kind::kDict: return static_cast<int64_t>(v.dict()->size());
    default: return InvalidArgument("object of type '" + v.TypeName() + "' has no len()");
  }
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Sorting key comparison: strings case-insensitively unless asked otherwise (jinja2's sort).
StatusOr<bool> Less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) return Lower(a.str()) < Lower(b.str());
  TANDEM_ASSIGN_OR_RETURN(const int c, Compare(a, b));
  return c < 0;
}

StatusOr<List> Sorted(List items, bool reverse, bool case_sensitive, const Value* attribute) {
  Status error;
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (Value& item : items) {
    Value key = item;
    if (attribute && attribute->is_string()) {
      TANDEM_ASSIGN_OR_RETURN(key, Attribute(item, attribute->str()));
    }
    keyed.emplace_back(std::move(key), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto r =
        reverse ? Less(y.first, x.first, case_sensitive) : Less(x.first, y.first, case_sensitive);
    if (!r.ok()) {
      error = r.status();
      return false;
    }
    return *r;
  });
  TANDEM_RETURN_IF_ERROR(error);
  List out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

// select / reject / selectattr / rejectattr: keep the items whose test (or truth) is `keep`.
StatusOr<Value> SelectFilter(const Value& value, Args& args, bool by_attribute, bool keep) {
  TANDEM_ASSIGN_OR_RETURN(List items, Iterate(value));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return ArgumentError("selectattr", "expects an attribute name");
    }
    attribute = args.positional[0].str();
    next = 1;
  }
  std::string test;
  Args test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return ArgumentError("select", "expects a test name");
    test = args.positional[next].str();
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next) + 1,
                                args.positional.end());
  }
  List out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      TANDEM_ASSIGN_OR_RETURN(subject, Attribute(item, attribute));
    }
    bool pass = subject.Truthy();
    if (!test.empty()) {
      TANDEM_ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

StatusOr<Value> MapFilter(const Value& value, Args& args) {
  TANDEM_ASSIGN_OR_RETURN(List items, Iterate(value));
  List out;
  if (const Value* attribute = Arg(args, 99, "attribute"); attribute != nullptr) {
    const Value* fallback = Arg(args, 99, "default");
    for (const Value& item : items) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Attribute(item, attribute->ToString()));
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return ArgumentError("map", "expects a filter name or attribute=");
  }
  const std::string filter = args.positional[0].str();
  Args rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    Args copy = rest;
    TANDEM_ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, copy));
    out.push_back(std::move(v));
  }
  return Value(std::move(out));
}

StatusOr<Value> ToInt(const Value& v, const Value& fallback) {
  switch (v.kind()) {
    case Kind::kBool:
    case Kind::kInt: return Value(v.as_int());
    case Kind::kFloat: return Value(static_cast<int64_t>(v.as_float()));
    case Kind::kString: {
      const std::string s = Strip(v.str(), "", true, true);
      char* end = nullptr;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(i));
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(d));
      return fallback;
    }
    default: return fallback;
  }
}

StatusOr<Value> ToFloat(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    const std::string s = Strip(v.str(), "", true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return fallback;
}

std::string Indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    const bool last = nl == std::string::npos;
    if (last) nl = s.size();
    const std::string line = s.substr(start, nl - start);
    const bool indent = (is_first ? first : true) && (blank || !line.empty());
    if (indent) out += pad;
    out += line;
    if (!last) out += '\n';
    is_first = false;
    if (last) break;
    start = nl + 1;
  }
  return out;
}

using FilterFn = StatusOr<Value> (*)(const Value&, Args&);

const std::map<std::string, FilterFn>& Filters() {
  static const std::map<std::string, FilterFn> kFilters = {
      {"abs",
       [](const Value& v, Args&) -> StatusOr<Value> {
         if (v.kind() == Kind::kFloat) return Value(std::fabs(v.as_float()));
         if (v.is_number()) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
         return ArgumentError("abs", "expects a number");
       }},
      {"attr",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value* name = Arg(a, 0, "name");
         if (!name || !name->is_string()) return ArgumentError("attr", "expects a name");
         if (v.is_dict()) {
           const Value* f = v.dict()->Find(name->str());
           return f ? *f : Value::MakeUndefined(name->str());
         }
         return Value::MakeUndefined(name->str());
       }},
      {"capitalize",
       [](const Value& v, Args&) -> StatusOr<Value> { return Value(Capitalize(v.ToString())); }},
      {"count",
       [](const Value& v, Args&) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(int64_t n, Length(v));
         return Value(n);
       }},
      {"default",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value fallback = ArgOr(a, 0, "default_value", Value(""));
         const bool boolean = ArgOr(a, 1, "boolean", Value(false)).Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
         return v;
       }},
      {"dictsort",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         if (!v.is_dict()) return ArgumentError("dictsort", "expects a dict");
         const bool cs = ArgOr(a, 0, "case_sensitive", Value(false)).Truthy();
         const bool by_value = ArgOr(a, 1, "by", Value("key")).ToString() == "value";
         const bool reverse = ArgOr(a, 2, "reverse", Value(false)).Truthy();
         List pairs;
         for (const auto& [k, e] : v.dict()->items()) pairs.emplace_back(List{Value(k), e});
         const Value attribute(by_value ? "1" : "0");
         TANDEM_ASSIGN_OR_RETURN(List sorted, Sorted(std::move(pairs), reverse, cs, &attribute));
         return Value(std::move(sorted));
       }},
      {"escape",
       [](const Value& v, Args&) -> StatusOr<Value> { return Value(HtmlEscape(v.ToString())); }},
      {"first",
       [](const Value& v, Args&) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         return items.empty() ? Value::MakeUndefined("first") : items.front();
       }},
      {"float",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         return ToFloat(v, ArgOr(a, 0, "default", Value(0.0)));
       }},
      {"indent",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value width = ArgOr(a, 0, "width", Value(4));
         const std::string pad =
             width.is_string()
                 ? width.str()
                 : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
         return Value(Indent(v.ToString(), pad, ArgOr(a, 1, "first", Value(false)).Truthy(),
                             ArgOr(a, 2, "blank", Value(false)).Truthy()));
       }},
      {"int",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         return ToInt(v, ArgOr(a, 0, "default", Value(0)));
       }},
      {"items",
       [](const Value& v, Args&) -> StatusOr<Value> {
         List pairs;
         if (v.is_undefined()) return Value(std::move(pairs));
         if (!v.is_dict()) return ArgumentError("items", "expects a dict");
         for (const auto& [k, e] : v.dict()->items()) pairs.emplace_back(List{Value(k), e});
         return Value(std::move(pairs));
       }},
      {"join",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         const std::string sep = ArgOr(a, 0, "d", Value("")).ToString();
         const Value* attribute = Arg(a, 1, "attribute");
         std::string out;
         for (size_t i = 0; i < items.size(); ++i) {
           if (i) out += sep;
           Value item = items[i];
           if (attribute) {
             TANDEM_ASSIGN_OR_RETURN(item, Attribute(item, attribute->ToString()));
           }
           out += item.ToString();
         }
         return Value(std::move(out));
       }},
      {"last",
       [](const Value& v, Args&) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         return items.empty() ? Value::MakeUndefined("last") : items.back();
       }},
      {"length",
       [](const Value& v, Args&) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(int64_t n, Length(v));
         return Value(n);
       }},
      {"list",
       [](const Value& v, Args&) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         return Value(std::move(items));
       }},
      {"lower",
       [](const Value& v, Args&) -> StatusOr<Value> { return Value(Lower(v.ToString())); }},
      {"map", MapFilter},
      {"max",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         if (items.empty()) return Value::MakeUndefined("max");
         TANDEM_ASSIGN_OR_RETURN(
             List s,
             Sorted(std::move(items), true, ArgOr(a, 0, "case_sensitive", Value(false)).Truthy(),
                    Arg(a, 1, "attribute")));
         return s.front();
       }},
      {"min",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         if (items.empty()) return Value::MakeUndefined("min");
         TANDEM_ASSIGN_OR_RETURN(
             List s,
             Sorted(std::move(items), false, ArgOr(a, 0, "case_sensitive", Value(false)).Truthy(),
                    Arg(a, 1, "attribute")));
         return s.front();
       }},
      {"reject", [](const Value& v, Args& a) { return SelectFilter(v, a, false, false); }},
      {"rejectattr", [](const Value& v, Args& a) { return SelectFilter(v, a, true, false); }},
      {"replace",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value* from = Arg(a, 0, "old");
         const Value* to = Arg(a, 1, "new");
         if (!from || !to) return ArgumentError("replace", "expects old and new");
         return Value(Replace(
             v.ToString(), from->ToString(), to->ToString(),
             ArgOr(a, 2, "count", Value::None()).is_none() ? -1 : Arg(a, 2, "count")->as_int()));
       }},
      {"reverse",
       [](const Value& v, Args&) -> StatusOr<Value> {
         if (v.is_string()) {
           std::vector<std::string> cps = CodePoints(v.str());
           std::string out;
           for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
           return Value(std::move(out));
         }
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         std::reverse(items.begin(), items.end());
         return Value(std::move(items));
       }},
      {"round",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         if (!v.is_number()) return ArgumentError("round", "expects a number");
         const int64_t precision = ArgOr(a, 0, "precision", Value(0)).as_int();
         const std::string method = ArgOr(a, 1, "method", Value("common")).ToString();
         const double scale = std::pow(10.0, static_cast<double>(precision));
         const double x = v.as_float() * scale;
         const double r = method == "ceil"    ? std::ceil(x)
                          : method == "floor" ? std::floor(x)
                                              : std::nearbyint(x);
         return Value(r / scale);
       }},
      {"safe", [](const Value& v, Args&) -> StatusOr<Value> { return v; }},
      {"select", [](const Value& v, Args& a) { return SelectFilter(v, a, false, true); }},
      {"selectattr", [](const Value& v, Args& a) { return SelectFilter(v, a, true, true); }},
      {"sort",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         TANDEM_ASSIGN_OR_RETURN(
             List s,
             Sorted(std::move(items), ArgOr(a, 0, "reverse", Value(false)).Truthy(),
                    ArgOr(a, 1, "case_sensitive", Value(false)).Truthy(), Arg(a, 2, "attribute")));
         return Value(std::move(s));
       }},
      {"string", [](const Value& v, Args&) -> StatusOr<Value> { return Value(v.ToString()); }},
      {"sum",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         const Value* attribute = Arg(a, 0, "attribute");
         Value total = ArgOr(a, 1, "start", Value(0));
         for (Value item : items) {
           if (attribute) {
             TANDEM_ASSIGN_OR_RETURN(item, Attribute(item, attribute->ToString()));
           }
           if (!item.is_number() || !total.is_number())
             return ArgumentError("sum", "expects numbers");
           if (item.kind() == Kind::kFloat || total.kind() == Kind::kFloat) {
             total = Value(total.as_float() + item.as_float());
           } else {
             total = Value(total.as_int() + item.as_int());
           }
         }
         return total;
       }},
      {"title",
       [](const Value& v, Args&) -> StatusOr<Value> { return Value(Title(v.ToString())); }},
      {"tojson",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value indent = ArgOr(a, 0, "indent", Value::None());
         TANDEM_ASSIGN_OR_RETURN(
             std::string s, v.ToJson(indent.is_none() ? -1 : static_cast<int>(indent.as_int())));
         return Value(std::move(s));
       }},
      {"trim",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         const Value chars = ArgOr(a, 0, "chars", Value::None());
         return Value(Strip(v.ToString(), chars.is_none() ? "" : chars.ToString(), true, true));
       }},
      {"unique",
       [](const Value& v, Args& a) -> StatusOr<Value> {
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(v));
         const bool cs = ArgOr(a, 0, "case_sensitive", Value(false)).Truthy();
         List out;
         for (const Value& item : items) {
           const bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) {
             if (!cs && o.is_string() && item.is_string())
               return Lower(o.str()) == Lower(item.str());
             return Equal(o, item);
           });
           if (!seen) out.push_back(item);
         }
         return Value(std::move(out));
       }},
      {"upper",
       [](const Value& v, Args&) -> StatusOr<Value> { return Value(Upper(v.ToString())); }},
      {"wordcount",
       [](const Value& v, Args&) -> StatusOr<Value> {
         return Value(static_cast<int64_t>(Split(v.ToString(), nullptr, -1).size()));
       }},
  };
  return kFilters;
}

using TestFn = StatusOr<bool> (*)(const Value&, Args&);

StatusOr<bool> CompareTest(const Value& v, Args& a, int want_lo, int want_hi) {
  if (a.positional.empty()) return ArgumentError("comparison test", "expects a value");
  TANDEM_ASSIGN_OR_RETURN(const int c, Compare(v, a.positional[0]));
  return c >= want_lo && c <= want_hi;
}

const std::map<std::string, TestFn>& Tests() {
  static const std::map<std::string, TestFn> kTests = {
      {"boolean", [](const Value& v, Args&) -> StatusOr<bool> { return v.kind() == Kind::kBool; }},
      {"callable",
       [](const Value& v, Args&) -> StatusOr<bool> { return v.kind() == Kind::kCallable; }},
      {"defined", [](const Value& v, Args&) -> StatusOr<bool> { return !v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, Args& a) -> StatusOr<bool> {
         if (a.positional.empty() || !v.is_number() || a.positional[0].as_int() == 0) {
           return ArgumentError("divisibleby", "expects a non-zero number");
         }
         return v.as_int() % a.positional[0].as_int() == 0;
       }},
      {"eq",
       [](const Value& v, Args& a) -> StatusOr<bool> {
         return !a.positional.empty() && Equal(v, a.positional[0]);
       }},
      {"even",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_number() && v.as_int() % 2 == 0;
       }},
      {"false",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.kind() == Kind::kBool && !v.as_bool();
       }},
      {"float", [](const Value& v, Args&) -> StatusOr<bool> { return v.kind() == Kind::kFloat; }},
      {"ge", [](const Value& v, Args& a) { return CompareTest(v, a, 0, 1); }},
      {"gt", [](const Value& v, Args& a) { return CompareTest(v, a, 1, 1); }},
      {"in",
       [](const Value& v, Args& a) -> StatusOr<bool> {
         if (a.positional.empty()) return ArgumentError("in", "expects a container");
         const Value& c = a.positional[0];
         if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
         if (c.is_dict()) return v.is_string() && c.dict()->Find(v.str()) != nullptr;
         TANDEM_ASSIGN_OR_RETURN(List items, Iterate(c));
         return std::any_of(items.begin(), items.end(),
                            [&](const Value& x) { return Equal(x, v); });
       }},
      {"integer", [](const Value& v, Args&) -> StatusOr<bool> { return v.kind() == Kind::kInt; }},
      {"iterable",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"le", [](const Value& v, Args& a) { return CompareTest(v, a, -1, 0); }},
      {"lower",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_string() && Lower(v.str()) == v.str() && Upper(v.str()) != v.str();
       }},
      {"lt", [](const Value& v, Args& a) { return CompareTest(v, a, -1, -1); }},
      {"mapping", [](const Value& v, Args&) -> StatusOr<bool> { return v.is_dict(); }},
      {"ne",
       [](const Value& v, Args& a) -> StatusOr<bool> {
         return a.positional.empty() || !Equal(v, a.positional[0]);
       }},
      {"none", [](const Value& v, Args&) -> StatusOr<bool> { return v.is_none(); }},
      {"number", [](const Value& v, Args&) -> StatusOr<bool> { return v.is_number(); }},
      {"odd",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_number() && v.as_int() % 2 != 0;
       }},
      {"sameas",
       [](const Value& v, Args& a) -> StatusOr<bool> {
         return !a.positional.empty() && v.kind() == a.positional[0].kind() &&
                Equal(v, a.positional[0]);
       }},
      {"sequence",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_string() || v.is_list() || v.is_dict();
       }},
      {"string", [](const Value& v, Args&) -> StatusOr<bool> { return v.is_string(); }},
      {"true",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.kind() == Kind::kBool && v.as_bool();
       }},
      {"undefined", [](const Value& v, Args&) -> StatusOr<bool> { return v.is_undefined(); }},
      {"upper",
       [](const Value& v, Args&) -> StatusOr<bool> {
         return v.is_string() && Upper(v.str()) == v.str() && Lower(v.str()) != v.str();
       }},
  };
  return kTests;
}

}  // namespace

Status ArgumentError(const std::string& what, const std::string& message) {
  return InvalidArgument(what + ": " + message);
}

StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, Args& args) {
  const std::string canonical = name == "d" ? "default" : name == "e" ? "escape" : name;
  const auto& filters = Filters();
  auto it = filters.find(canonical);
  if (it == filters.end()) return InvalidArgument("no filter named '" + name + "'");
  return it->second(value, args);
}

StatusOr<bool> ApplyTest(const std::string& name, const Value& value, Args& args) {
  static const std::map<std::string, std::string> kAliases = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"},          {"<", "lt"}, {"lessthan", "lt"},
      {"<=", "le"}, {">", "gt"},       {"greaterthan", "gt"}, {">=", "ge"}};
  auto alias = kAliases.find(name);
  const std::string& canonical = alias == kAliases.end() ? name : alias->second;
  const auto& tests = Tests();
  auto it = tests.find(canonical);
  if (it == tests.end()) return InvalidArgument("no test named '" + name + "'");
  return it->second(value, args);
}

}  // namespace tandem::jinja
