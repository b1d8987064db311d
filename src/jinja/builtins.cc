#include "jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>

namespace tandem::jinja {
namespace {

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

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Case mapping of the scripts chat templates meet (Python's str.upper / lower for ASCII, Latin-1,
// Latin Extended-A, Greek and Cyrillic; other code points are left as they are).
uint32_t UpperCp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
uint32_t LowerCp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

uint32_t DecodeCp(const std::string& cp) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(cp[i])); };
  switch (cp.size()) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Maps each code point: upper (ß becomes "SS"), lower, or by position (title / capitalize).
enum class CaseMode { kUpper, kLower, kTitle, kCapitalize };
std::string MapCase(const std::string& s, CaseMode mode) {
  std::string out;
  bool prev_cased = false, first = true;
  for (const std::string& cp : CodePoints(s)) {
    const uint32_t c = DecodeCp(cp);
    const bool cased = UpperCp(c) != c || LowerCp(c) != c || c == 0xDF;
    bool up = mode == CaseMode::kUpper;
    if (mode == CaseMode::kTitle) up = cased && !prev_cased;
    if (mode == CaseMode::kCapitalize) up = first;
    first = false;
    if (mode == CaseMode::kTitle) prev_cased = cased;
    if (up && c == 0xDF) {
      out += mode == CaseMode::kUpper ? "SS" : "Ss";
    } else if (c >= 0x10000 || (cp.size() == 1 && c >= 0x80)) {
      out += cp;  // beyond the mapped scripts, or a stray byte: as it is
    } else {
      AppendUtf8(up ? UpperCp(c) : LowerCp(c), &out);
    }
  }
  return out;
}

std::string Lower(const std::string& s) { return MapCase(s, CaseMode::kLower); }
std::string Upper(const std::string& s) { return MapCase(s, CaseMode::kUpper); }
std::string Capitalize(const std::string& s) { return MapCase(s, CaseMode::kCapitalize); }
std::string Title(const std::string& s) { return MapCase(s, CaseMode::kTitle); }

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` around every character
    for (const std::string& cp : CodePoints(s)) {
      if (count >= 0 && done >= count) {
        out += cp;
        continue;
      }
      out += to + cp;
      ++done;
    }
    return (count < 0 || done < count) ? out + to : out;
  }
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

List Split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsWs(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && IsWs(rest.back())) rest.pop_back();
        out.emplace_back(rest);
        return out;
      }
      size_t j = i;
      while (j < s.size() && !IsWs(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->str();
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
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

std::shared_ptr<Callable> MakeCallable(std::string name, std::function<StatusOr<Value>(Args&)> fn) {
  return std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
}

std::optional<Value> StringMethod(const std::string& s, const std::string& name) {
  using Fn = std::function<StatusOr<Value>(Args&)>;
  Fn fn;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    fn = [s, left, right](Args& a) -> StatusOr<Value> {
      const Value chars = ArgOr(a, 0, "chars", Value::None());
      return Value(Strip(s, chars.is_none() ? "" : chars.ToString(), left, right));
    };
  } else if (name == "split") {
    fn = [s](Args& a) -> StatusOr<Value> {
      return Value(Split(s, Arg(a, 0, "sep"), ArgOr(a, 1, "maxsplit", Value(-1)).as_int()));
    };
  } else if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    fn = [s, start](Args& a) -> StatusOr<Value> {
      if (a.positional.empty())
        return ArgumentError(start ? "startswith" : "endswith", "expects a string");
      List options = a.positional[0].is_list() ? a.positional[0].list() : List{a.positional[0]};
      for (const Value& o : options) {
        const std::string p = o.ToString();
        const bool hit =
            start ? s.compare(0, p.size(), p) == 0
                  : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value(true);
      }
      return Value(false);
    };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    fn = [s, name](Args&) -> StatusOr<Value> {
      return Value(name == "upper"   ? Upper(s)
                   : name == "lower" ? Lower(s)
                   : name == "title" ? Title(s)
                                     : Capitalize(s));
    };
  } else if (name == "replace") {
    fn = [s](Args& a) -> StatusOr<Value> {
      if (a.positional.size() < 2) return ArgumentError("replace", "expects old and new");
      return Value(Replace(s, a.positional[0].ToString(), a.positional[1].ToString(),
                           a.positional.size() > 2 ? a.positional[2].as_int() : -1));
    };
  } else if (name == "find" || name == "rfind" || name == "count") {
    fn = [s, name](Args& a) -> StatusOr<Value> {
      if (a.positional.empty()) return ArgumentError(name, "expects a string");
      const std::string sub = a.positional[0].ToString();
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(CodePoints(s).size() + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value(p == std::string::npos
                       ? int64_t{-1}
                       : static_cast<int64_t>(CodePoints(s.substr(0, p)).size()));
    };
  } else if (name == "join") {
    fn = [s](Args& a) -> StatusOr<Value> {
      if (a.positional.empty()) return ArgumentError("join", "expects an iterable");
      TANDEM_ASSIGN_OR_RETURN(List items, Iterate(a.positional[0]));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) return ArgumentError("join", "expects strings");
        if (i) out += s;
        out += items[i].str();
      }
      return Value(std::move(out));
    };
  } else if (name == "splitlines") {
    fn = [s](Args&) -> StatusOr<Value> {
      List out;
      size_t start = 0;
      while (start < s.size()) {
        size_t nl = s.find('\n', start);
        if (nl == std::string::npos) nl = s.size();
        std::string line = s.substr(start, nl - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.emplace_back(std::move(line));
        start = nl + 1;
      }
      return Value(std::move(out));
    };
  } else if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    fn = [s, name](Args&) -> StatusOr<Value> {
      if (s.empty()) return Value(false);
      for (unsigned char c : s) {
        const bool ok = name == "isdigit"   ? std::isdigit(c)
                        : name == "isalpha" ? std::isalpha(c)
                        : name == "isspace" ? std::isspace(c)
                                            : std::isalnum(c);
        if (!ok) return Value(false);
      }
      return Value(true);
    };
  } else {
    return std::nullopt;
  }
  return Value(MakeCallable("str." + name, std::move(fn)));
}

}  // namespace

Status ArgumentError(const std::string& what, const std::string& message) {
  return InvalidArgument(what + ": " + message);
}

std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const auto drop = [&](char c) {
    return chars.empty() ? IsWs(c) : chars.find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(s[b])) ++b;
  }
  if (right) {
    while (e > b && drop(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
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

std::optional<Value> BoundMethod(const Value& obj, const std::string& name) {
  if (obj.is_string()) return StringMethod(obj.str(), name);
  if (obj.is_dict() && !obj.dict()->is_namespace) {
    const std::shared_ptr<Dict> d = obj.dict();
    if (name == "items" || name == "keys" || name == "values") {
      return Value(MakeCallable("dict." + name, [d, name](Args&) -> StatusOr<Value> {
        List out;
        for (const auto& [k, v] : d->items()) {
          out.push_back(name == "items" ? Value(List{Value(k), v}) : name == "keys" ? Value(k) : v);
        }
        return Value(std::move(out));
      }));
    }
    if (name == "get") {
      return Value(MakeCallable("dict.get", [d](Args& a) -> StatusOr<Value> {
        if (a.positional.empty()) return ArgumentError("get", "expects a key");
        const Value* f = a.positional[0].is_string() ? d->Find(a.positional[0].str()) : nullptr;
        return f ? *f : (a.positional.size() > 1 ? a.positional[1] : Value::None());
      }));
    }
    return std::nullopt;
  }
  if (obj.is_list() && (name == "index" || name == "count")) {
    const List items = obj.list();
    return Value(MakeCallable("list." + name, [items, name](Args& a) -> StatusOr<Value> {
      if (a.positional.empty()) return ArgumentError(name, "expects a value");
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!Equal(items[i], a.positional[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return InvalidArgument("list.index(x): x not in list");
      return Value(n);
    }));
  }
  return std::nullopt;
}

std::optional<Value> GlobalFunction(const std::string& name) {
  if (name == "range") {
    return Value(MakeCallable("range", [](Args& a) -> StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : a.positional) {
        if (v.kind() != Kind::kInt && v.kind() != Kind::kBool)
          return ArgumentError("range", "expects integers");
      }
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else if (a.positional.size() == 2 || a.positional.size() == 3) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      } else {
        return ArgumentError("range", "expects 1 to 3 integers");
      }
      if (step == 0) return ArgumentError("range", "step must not be zero");
      constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= kMaxRange)
          return ArgumentError("range", "too many items");
        out.emplace_back(i);
      }
      return Value(std::move(out));
    }));
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value(MakeCallable(name, [ns](Args& a) -> StatusOr<Value> {
      auto d = std::make_shared<Dict>();
      d->is_namespace = ns;
      for (const Value& p : a.positional) {
        if (!p.is_dict())
          return ArgumentError(ns ? "namespace" : "dict", "expects a dict or keywords");
        for (const auto& [k, v] : p.dict()->items()) d->Set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d->Set(k, v);
      return Value(std::move(d));
    }));
  }
  if (name == "raise_exception") {
    return Value(MakeCallable("raise_exception", [](Args& a) -> StatusOr<Value> {
      return InvalidArgument(a.positional.empty() ? std::string("raise_exception")
                                                  : a.positional[0].ToString());
    }));
  }
  if (name == "strftime_now") {
    return Value(MakeCallable("strftime_now", [](Args& a) -> StatusOr<Value> {
      if (a.positional.empty()) return ArgumentError("strftime_now", "expects a format");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].ToString().c_str(), &local);
      return Value(std::string(buf, n));
    }));
  }
  return std::nullopt;
}

}  // namespace tandem::jinja
