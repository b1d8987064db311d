#include "server/http_util.h"

#include "common/http_status.h"

namespace tandem::server {

using serving::FinishReason;

Outcome OutcomeOf(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return Outcome::kSuccess;
    case FinishReason::kLength: return Outcome::kLength;
    case FinishReason::kCancelled: return Outcome::kCancelled;
    case FinishReason::kError: return Outcome::kError;
    case FinishReason::kTimeout: return Outcome::kTimeout;
  }
  return Outcome::kError;
}

ApiError FailureError(const serving::FinishInfo& info, double timeout_s) {
  // The finish reason as a Status code, so that the HTTP status is the one mapping's.
  const StatusCode code = info.reason == FinishReason::kTimeout     ? StatusCode::kDeadlineExceeded
                          : info.reason == FinishReason::kCancelled ? StatusCode::kCancelled
                                                                    : StatusCode::kInternal;
  ApiError e;
  e.status = HttpStatusFor(code);
  switch (code) {
    case StatusCode::kDeadlineExceeded:
      e.type = "timeout";
      // The request's own deadline, or a shorter limit inside it (e.g. the KV cache of a
      // disaggregated request did not arrive): name the limit that was hit.
      if (info.message.empty() || info.message == serving::kRequestDeadlinePassed) {
        e.message = "the request did not finish within " +
                    std::to_string(static_cast<int>(timeout_s)) + " s (the request timeout)";
      } else {
        e.message = "the request timed out: " + info.message;
      }
      break;
    case StatusCode::kCancelled:
      e.type = "server_error";
      e.message = "the request was cancelled (server shutting down)";
      break;
    default:
      e.type = "server_error";
      e.message = "generation failed" + (info.message.empty() ? "" : ": " + info.message);
  }
  return e;
}

ApiError SubmitError(const Status& st, Outcome* outcome) {
  ApiError e;
  e.message = st.message();
  e.status = HttpStatusFor(st.code());
  switch (e.status) {
    case 429:
      e.type = "rate_limit_error";
      *outcome = Outcome::kRejected;
      break;
    case 503:
      e.type = "server_error";
      *outcome = Outcome::kRejected;
      break;
    case 400: *outcome = Outcome::kBadRequest; break;
    default: e.type = "server_error"; *outcome = Outcome::kError;
  }
  return e;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tandem::server
