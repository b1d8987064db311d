// builtins.h, second part: the Python methods of str, dict and list, and the globals.
#include <ctime>

#include "jinja/builtins.h"
#include "jinja/text.h"

namespace tandem::jinja {

using Kind = Value::Kind;

std::shared_ptr<Callable> MakeCallable(std::string name, std::function<StatusOr<Value>(Args&)> fn) {
  return std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
}

namespace {

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
