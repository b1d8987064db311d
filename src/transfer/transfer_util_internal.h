// Internal to src/transfer: RAII owners of file descriptors and memory mappings, socket helpers
// and small host facts shared by the engine core and its transports.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "common/status.h"

namespace tandem::transfer {

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Owns one mmap'ed range; unmaps it on destruction. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~Mapping() { Reset(); }
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Reset();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* addr() const { return addr_; }
  size_t size() const { return size_; }
  void Reset();

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

// Status from errno: "<what>: <strerror(err)>" with a code matching the error class.
Status ErrnoStatus(const std::string& what, int err);

// The boot id of this host (/proc/sys/kernel/random/boot_id), trimmed. Two processes may share
// memory through /proc/<pid>/fd only when their host ids are equal.
StatusOr<std::string> ReadHostId();

// "host:port" -> (host, port). Port must be 1..65535; IPv6 hosts may be bracketed ("[::1]:80").
StatusOr<std::pair<std::string, int>> ParseEndpoint(const std::string& endpoint);

// Milliseconds from now until `t`, clamped to [0, cap_ms]; for poll() timeouts.
int MillisUntil(std::chrono::steady_clock::time_point t, int cap_ms);

// Creates a listening TCP socket bound to host:port (port 0: ephemeral). Returns the socket and
// the bound port.
StatusOr<std::pair<UniqueFd, int>> ListenTcp(const std::string& host, int port);

// Applies the data-path socket options: TCP_NODELAY, a 50 ms send timeout (SO_SNDTIMEO, so that
// SendAll can notice an abort), and 4 MiB send and receive buffers when the kernel allows that
// much (net.core.[rw]mem_max); otherwise the kernel's autotuning is left in charge.
void TuneDataSocket(int fd);

// Starts a non-blocking connect to host:port; the caller waits for writability (poll) and checks
// SO_ERROR with FinishConnect. The returned socket is in non-blocking mode.
StatusOr<UniqueFd> StartConnect(const std::string& host, int port);
// Waits until `deadline` for a connect started by StartConnect to finish, then switches the
// socket back to blocking mode.
Status FinishConnect(int fd, std::chrono::steady_clock::time_point deadline);

// Result of one bounded I/O step.
enum class IoResult { kOk, kAborted, kClosed, kError };

// Sends every byte described by iov[0..iovcnt) (the array is modified as bytes go out) with
// sendmsg(MSG_NOSIGNAL), straight from the caller's buffers. The socket must have a send timeout
// (SO_SNDTIMEO, set by TuneDataSocket) so that a peer that stops reading cannot pin the caller:
// whenever the kernel buffer stays full for a timeout slice, should_abort() is asked and kAborted
// returned when it says so. On kError, *err holds errno.
IoResult SendAll(int fd, struct iovec* iov, int iovcnt, const std::function<bool()>& should_abort,
                 int* err);

// Receives exactly n bytes into buf. Waits with poll() in slices of at most 20 ms; between
// slices calls should_abort() and returns kAborted when it says so. kClosed on EOF (also in the
// middle of the range), kError with *err = errno on a socket error.
IoResult RecvExact(int fd, void* buf, size_t n, const std::function<bool()>& should_abort,
                   int* err);

// The cluster token handshake of a new TCP connection (common/cluster_auth.h, tcp_handshake),
// as the side that connected and as the side that accepted; OK at once without a token.
// Unauthenticated when the peer fails to prove the token; other errors for I/O (should_abort
// as for RecvExact bounds the wait).
Status InitiatorHandshake(int fd, const std::function<bool()>& should_abort);
Status TargetHandshake(int fd, const std::function<bool()>& should_abort);

}  // namespace tandem::transfer
