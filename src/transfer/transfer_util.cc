#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "transfer/transfer_util_internal.h"

namespace tandem::transfer {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Mapping::Reset() {
  if (addr_ != nullptr && size_ > 0) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

Status ErrnoStatus(const std::string& what, int err) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOENT:
    case ESRCH: code = StatusCode::kNotFound; break;
    case EACCES:
    case EPERM: code = StatusCode::kFailedPrecondition; break;
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC: code = StatusCode::kResourceExhausted; break;
    case EINVAL: code = StatusCode::kInvalidArgument; break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED:
    case ENOTCONN: code = StatusCode::kUnavailable; break;
    case ETIMEDOUT: code = StatusCode::kDeadlineExceeded; break;
    default: break;
  }
  return Status(code, what + ": " + std::strerror(err));
}

StatusOr<std::string> ReadHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!in || !std::getline(in, id)) {
    return Unavailable("cannot read /proc/sys/kernel/random/boot_id");
  }
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.empty()) return Unavailable("empty /proc/sys/kernel/random/boot_id");
  return id;
}

StatusOr<std::pair<std::string, int>> ParseEndpoint(const std::string& endpoint) {
  std::string host;
  std::string port_text;
  if (!endpoint.empty() && endpoint[0] == '[') {
    const size_t close = endpoint.find(']');
    if (close == std::string::npos || close + 1 >= endpoint.size() || endpoint[close + 1] != ':') {
      return InvalidArgument("bad endpoint '" + endpoint + "': expected [host]:port");
    }
    host = endpoint.substr(1, close - 1);
    port_text = endpoint.substr(close + 2);
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return InvalidArgument("bad endpoint '" + endpoint + "': expected host:port");
    }
    host = endpoint.substr(0, colon);
    port_text = endpoint.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgument("bad port in endpoint '" + endpoint + "'");
  }
  const int port = std::stoi(port_text);
  if (port < 1 || port > 65535) return InvalidArgument("port out of range in '" + endpoint + "'");
  return std::make_pair(host, port);
}

int MillisUntil(std::chrono::steady_clock::time_point t, int cap_ms) {
  const auto now = std::chrono::steady_clock::now();
  if (t <= now) return 0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
  return static_cast<int>(std::min<int64_t>(ms, cap_ms));
}

namespace {

// Resolves host:port (numeric or name) for TCP; the caller frees the list.
StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  return res;
}

int ReadSysctl(const char* path) {
  std::ifstream in(path);
  long long v = 0;
  if (!(in >> v)) return 0;
  return static_cast<int>(std::min<long long>(v, 1 << 30));
}

}  // namespace

StatusOr<std::pair<UniqueFd, int>> ListenTcp(const std::string& host, int port) {
  TANDEM_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, /*passive=*/true));
  Status last = Unavailable("no address for '" + host + "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoStatus("socket", errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoStatus("bind " + host + ":" + std::to_string(port), errno);
      continue;
    }
    if (::listen(fd.get(), 256) != 0) {
      last = ErrnoStatus("listen", errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      last = ErrnoStatus("getsockname", errno);
      continue;
    }
    int bound_port = 0;
    if (bound.ss_family == AF_INET) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else if (bound.ss_family == AF_INET6) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    }
    ::freeaddrinfo(res);
    return std::make_pair(std::move(fd), bound_port);
  }
  ::freeaddrinfo(res);
  return last;
}

void TuneDataSocket(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{};
  tv.tv_usec = 50 * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  constexpr int kBuf = 4 << 20;  // bytes
  // Setting a buffer size switches autotuning off; only do it when the kernel grants the size.
  static const int wmem_max = ReadSysctl("/proc/sys/net/core/wmem_max");
  static const int rmem_max = ReadSysctl("/proc/sys/net/core/rmem_max");
  if (wmem_max >= kBuf) ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kBuf, sizeof(kBuf));
  if (rmem_max >= kBuf) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kBuf, sizeof(kBuf));
}

StatusOr<UniqueFd> StartConnect(const std::string& host, int port) {
  TANDEM_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, /*passive=*/false));
  // Only the first address is tried; endpoints are advertised as numeric addresses.
  UniqueFd fd(
      ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol));
  if (!fd.valid()) {
    const int err = errno;
    ::freeaddrinfo(res);
    return ErrnoStatus("socket", err);
  }
  TuneDataSocket(fd.get());
  const int rc = ::connect(fd.get(), res->ai_addr, res->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(res);
  if (rc != 0 && err != EINPROGRESS) {
    return ErrnoStatus("connect " + host + ":" + std::to_string(port), err);
  }
  return fd;
}

Status FinishConnect(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    const int rc = ::poll(&p, 1, MillisUntil(deadline, 1000));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoStatus("poll", errno);
    if (rc == 0) {
      if (std::chrono::steady_clock::now() >= deadline)
        return DeadlineExceeded("connect timed out");
      continue;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
      return ErrnoStatus("getsockopt", errno);
    if (err != 0) return ErrnoStatus("connect", err);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
      return ErrnoStatus("fcntl", errno);
    return OkStatus();
  }
}

IoResult SendAll(int fd, struct iovec* iov, int iovcnt, const std::function<bool()>& should_abort,
                 int* err) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, 64));
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a send-timeout slice passed
        if (should_abort()) return IoResult::kAborted;
        continue;
      }
      *err = errno;
      return IoResult::kError;
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && iovcnt > 0) {
      if (left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --iovcnt;
      } else {
        iov->iov_base = static_cast<char*>(iov->iov_base) + left;
        iov->iov_len -= left;
        left = 0;
      }
    }
  }
  return IoResult::kOk;
}

IoResult RecvExact(int fd, void* buf, size_t n, const std::function<bool()>& should_abort,
                   int* err) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = errno;
      return IoResult::kError;
    }
    // Nothing buffered: the only place this function waits, so the abort check lives here.
    if (should_abort()) return IoResult::kAborted;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 20) < 0 && errno != EINTR) {
      *err = errno;
      return IoResult::kError;
    }
  }
  return IoResult::kOk;
}

}  // namespace tandem::transfer
