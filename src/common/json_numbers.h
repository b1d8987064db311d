// A guard for JSON read by typed code. nlohmann::json turns a number into the type its reader
// asks for with a plain cast, which is undefined behaviour when the value does not fit: a
// float of 1e20 read as an int, 1e300 read as a float (found by fuzz/fuzz_worker_protocol.cc).
// The documents tandem's processes exchange carry no floating-point number beyond ±2^31 (times
// in seconds, rates, probabilities, penalties); refusing larger ones where a document enters
// makes every later get<int>() or get<float>() on it defined. Integers need no guard: integral
// conversions are defined (modular) in C++20.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

namespace tandem {

inline constexpr double kMaxJsonFloat = 2147483647.0;  // 2^31 - 1

// True when every floating-point number in `j` is finite and within ±kMaxJsonFloat. Walks the
// document with its own stack (any depth).
inline bool JsonFloatsBounded(const nlohmann::json& j) {
  std::vector<const nlohmann::json*> todo = {&j};
  while (!todo.empty()) {
    const nlohmann::json* v = todo.back();
    todo.pop_back();
    if (v->is_number_float()) {
      const double x = v->get<double>();
      if (!std::isfinite(x) || std::fabs(x) > kMaxJsonFloat) return false;
    } else if (v->is_structured()) {
      for (const nlohmann::json& child : *v) todo.push_back(&child);
    }
  }
  return true;
}

}  // namespace tandem
