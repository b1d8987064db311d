// Status and StatusOr: the one error type of tandem. No exceptions cross a library boundary.
//
//   StatusOr<GgufFile> f = GgufFile::Open(path);
//   if (!f.ok()) return f.status();
//   TANDEM_ASSIGN_OR_RETURN(auto model, Model::Load(*f));
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace tandem {

// Status and StatusOr are [[nodiscard]]: a dropped error is a compile warning (an error in CI).
// Where ignoring one is right, say why and write `(void)Call();` or use `.IgnoreError()`.

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kResourceExhausted,
  kFailedPrecondition,
  kUnimplemented,
  kDataLoss,
  kDeadlineExceeded,
  kUnavailable,
  kCancelled,
  kInternal,
  kUnauthenticated,  // the peer did not prove it holds the cluster token (common/cluster_auth.h)
};
inline constexpr StatusCode kLastStatusCode = StatusCode::kUnauthenticated;

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;
  // Returns a copy with "context: " prepended to the message.
  Status WithContext(const std::string& context) const;
  // Drops the status on purpose (best-effort clean-up paths); reads better than a cast.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}

namespace internal {
// Aborts with the status' text: value() of a StatusOr that holds an error (every build mode).
[[noreturn]] void DieOnBadStatusOrAccess(const Status& status);
// The status a StatusOr built from an OK Status holds instead (it has no value to give).
Status OkStatusWithoutValue();
}  // namespace internal

// Either a value or a non-OK Status. value() (and *, ->) on an error aborts in every build mode
// with the error's text; check ok() first. Built from an OK Status, it holds an INTERNAL error.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) { Guard(); }        // NOLINT
  StatusOr(Status&& status) : status_(std::move(status)) { Guard(); }  // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}                    // NOLINT
  StatusOr(const T& value) : value_(value) {}                          // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Guard() {
    if (status_.ok()) status_ = internal::OkStatusWithoutValue();
  }
  void Check() const {
    if (!status_.ok()) internal::DieOnBadStatusOrAccess(status_);
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace tandem

#define TANDEM_CONCAT_INNER(a, b) a##b
#define TANDEM_CONCAT(a, b) TANDEM_CONCAT_INNER(a, b)

#define TANDEM_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::tandem::Status _tandem_st = (expr);    \
    if (!_tandem_st.ok()) return _tandem_st; \
  } while (0)

#define TANDEM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define TANDEM_ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_CONCAT(_tandem_so_, __LINE__), lhs, expr)
