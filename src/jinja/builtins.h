// jinja2's built-in filters and tests, the Python methods of str, dict and list that templates
// call, and the globals of Hugging Face's chat-template environment (range, namespace, dict,
// raise_exception, strftime_now), each with Python's semantics for the values of value.h.
#pragma once

#include <optional>
#include <string>

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

// Python's str.strip family: chars empty means whitespace.
std::string Strip(const std::string& s, const std::string& chars, bool left, bool right);

}  // namespace tandem::jinja
