// The values a template computes with, shaped after the Python objects jinja2 hands around:
// undefined, None, bool, int, float, str, list (tuples too), dict (insertion-ordered, string
// keys) and callables (macros, bound methods, globals). Lists and dicts are shared by reference,
// as in Python; the renderer never mutates a list or dict it did not create (jinja2's immutable
// sandbox, the environment chat templates run in), except a namespace's attributes.
// Not thread-safe: a value belongs to the one render that made it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace tandem::jinja {

class Value;
class Dict;
struct Callable;
using List = std::vector<Value>;

class Value {
 public:
  struct Undefined {
    std::string name;  // what was looked up, for the error when it is used
  };
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value None() { return Value(nullptr); }
  Value(bool b) : v_(b) {}                                     // NOLINT(runtime/explicit)
  Value(int64_t i) : v_(i) {}                                  // NOLINT(runtime/explicit)
  Value(int i) : v_(static_cast<int64_t>(i)) {}                // NOLINT(runtime/explicit)
  Value(double d) : v_(d) {}                                   // NOLINT(runtime/explicit)
  Value(std::string s) : v_(std::move(s)) {}                   // NOLINT(runtime/explicit)
  Value(const char* s) : v_(std::string(s)) {}                 // NOLINT(runtime/explicit)
  Value(List l) : v_(std::make_shared<List>(std::move(l))) {}  // NOLINT(runtime/explicit)
  Value(std::shared_ptr<Dict> d) : v_(std::move(d)) {}         // NOLINT(runtime/explicit)
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}     // NOLINT(runtime/explicit)

  // A JSON document as Python's json.loads would give it (object key order kept).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_number() const {
    return kind() == Kind::kInt || kind() == Kind::kFloat || kind() == Kind::kBool;
  }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;   // bool or int
  double as_float() const;  // bool, int or float
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<std::shared_ptr<List>>(v_); }
  const std::shared_ptr<Dict>& dict() const { return std::get<std::shared_ptr<Dict>>(v_); }
  const std::shared_ptr<Callable>& callable() const {
    return std::get<std::shared_ptr<Callable>>(v_);
  }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  bool Truthy() const;           // Python's bool()
  std::string ToString() const;  // Python's str(): what {{ value }} prints
  std::string Repr() const;      // Python's repr()
  std::string TypeName() const;  // Python's type name, for errors
  // Python's json.dumps(value, ensure_ascii=False, indent=indent) with the separators it uses
  // by default (", " and ": "; "," at line ends when indented); indent < 0: on one line.
  StatusOr<std::string> ToJson(int indent) const;

 private:
  using Storage =
      std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
                   std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<Callable>>;
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  Storage v_;
};

// Keys in insertion order (Python dicts keep it; tojson and iteration show it).
class Dict {
 public:
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  bool is_namespace = false;  // made by namespace(): its attributes may be assigned

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

// Arguments of a call: positional, then keyword in the order written.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;  // for error messages
  std::function<StatusOr<Value>(Args&)> call;
};

// Python's ==, and the ordering of <, for the types templates compare (numbers with numbers,
// strings with strings, lists element by element); an ordering of other types is an error.
bool Equal(const Value& a, const Value& b);
StatusOr<int> Compare(const Value& a, const Value& b);  // <0, 0, >0

// Python's repr() of a float (shortest round trip; exponent form below 1e-4 and from 1e16).
std::string FloatRepr(double d);

// The code points of a UTF-8 string, each as its own string (Python iterates str so).
std::vector<std::string> CodePoints(std::string_view s);
// Appends the UTF-8 encoding of a code point (at most U+10FFFF).
void AppendUtf8(uint32_t code_point, std::string* out);

}  // namespace tandem::jinja
