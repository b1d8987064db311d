// TANDEM_CHECK: invariants that hold in every build mode, Release included (the default build
// defines NDEBUG, so assert() is off there). A failed check prints where and what, then aborts:
// use it for programming errors only; anything that input can cause returns a Status instead.
//
//   TANDEM_CHECK(n % block == 0) << "n=" << n;      // extra context is optional
//   TANDEM_CHECK_OK(writer.WriteFile(path));         // a Status that must be OK
#pragma once

#include <sstream>
#include <string>

#include "common/status.h"

namespace tandem::internal {

// Collects the message of a failed check and aborts in its destructor. Never returns.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Swallows the stream expression of a passing check (the `voidify` idiom): lets the macro be an
// expression statement without a dangling else.
struct CheckVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem::internal

#define TANDEM_CHECK(condition)                      \
  (condition) ? (void)0                              \
              : ::tandem::internal::CheckVoidify() & \
                    ::tandem::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define TANDEM_CHECK_OK(expr)                                                            \
  do {                                                                                   \
    const ::tandem::Status _tandem_check_st = (expr);                                    \
    TANDEM_CHECK(_tandem_check_st.ok()) << #expr << ": " << _tandem_check_st.ToString(); \
  } while (0)
