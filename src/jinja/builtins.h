// jinja2's built-in filters and tests, the Python methods of str, dict and list that templates
// call, and the globals of Hugging Face's chat-template environment (range, namespace, dict,
// raise_exception, strftime_now), each with Python's semantics for the values of value.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace tandem::jinja {

// value | name(args); an unknown filter is an error.
StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, Args& args);

// value is name(args); an unknown test is an error.
StatusOr<bool> ApplyTest(const std::string& name, const Value& value, Args& args);

// obj.name as a bound method of a str, dict or list; nullopt when the type has none so named.
std::optional<Value> BoundMethod(const Value& obj, const std::string& name);

// A global function by name; nullopt when there is none.
std::optional<Value> GlobalFunction(const std::string& name);

// Errors of arguments, shared by filters, methods and the renderer.
Status ArgumentError(const std::string& what, const std::string& message);

// Shared by the filters (builtins.cc) and the methods and globals (methods.cc).
// Argument `index` (positional) or `name` (keyword); null when absent.
const Value* Arg(const Args& a, size_t index, std::string_view name);
Value ArgOr(const Args& a, size_t index, std::string_view name, Value fallback);
// The items a for loop sees: a list's, a dict's keys, a string's characters.
StatusOr<List> Iterate(const Value& v);
std::shared_ptr<Callable> MakeCallable(std::string name, std::function<StatusOr<Value>(Args&)> fn);

}  // namespace tandem::jinja
