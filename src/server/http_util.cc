#include "server/http_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <vector>

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
  ApiError e;
  switch (info.reason) {
    case FinishReason::kTimeout:
      e.status = 504;
      e.type = "timeout";
      e.message = "the request did not finish within " + std::to_string(static_cast<int>(timeout_s)) +
                  " s" + (info.message.empty() ? "" : ": " + info.message);
      break;
    case FinishReason::kCancelled:
      e.status = 503;
      e.type = "server_error";
      e.message = "the request was cancelled (server shutting down)";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.message = "generation failed" + (info.message.empty() ? "" : ": " + info.message);
  }
  return e;
}

ApiError SubmitError(const Status& st, Outcome* outcome) {
  ApiError e;
  e.message = st.message();
  switch (st.code()) {
    case StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      *outcome = Outcome::kRejected;
      break;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      *outcome = Outcome::kRejected;
      break;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.status = 400;
      *outcome = Outcome::kBadRequest;
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      *outcome = Outcome::kError;
  }
  return e;
}

void WidenListenBacklog(int port) {
  std::vector<int> fds;
  try {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const std::string name = entry.path().filename().string();
      if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
        fds.push_back(std::stoi(name));
      }
    }
  } catch (const std::exception&) {
    return;  // no /proc: keep httplib's backlog
  }
  for (int fd : fds) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound == port) ::listen(fd, SOMAXCONN);
  }
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tandem::server
