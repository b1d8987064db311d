// The TCP transport's listener (transfer/tcp_transport_server.cc) reading what a peer sends:
// a real TcpServer on loopback with one 64 KiB segment, under a cluster token. Each input goes
// on a fresh connection: byte 0 even, the harness first completes the token handshake and the
// rest is transfer messages; odd, the rest is sent raw (an outsider: the handshake's parser).
// Then the connection is half-closed and every reply read until the server closes.
// Properties: no crash or sanitizer report (a write outside the segment is a heap overflow
// ASan reports); the server ends every connection (no thread left behind); the bytes around
// the segment, in the same allocation, are never touched.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/cluster_auth.h"
#include "fuzz/fuzz_util.h"
#include "transfer/tcp_transport.h"
#include "transfer/transport.h"

namespace {

using namespace tandem;
using namespace tandem::transfer;

constexpr size_t kSegmentBytes = 64 << 10;
constexpr size_t kGuardBytes = 4096;  // before and after the segment
constexpr uint8_t kGuard = 0xA5;

class OneSegmentHost final : public TransportHost {
 public:
  OneSegmentHost() : memory_(kSegmentBytes + 2 * kGuardBytes, kGuard) {
    region_ = std::make_shared<LocalRegion>();
    region_->segment_name = "seg";
    region_->base = memory_.data() + kGuardBytes;
    region_->size = kSegmentBytes;
  }
  const std::string& local_name() const override { return name_; }
  bool RunOnWorker(std::function<void()> fn) override {
    fn();
    return false;
  }
  std::shared_ptr<const LocalRegion> FindSegment(const std::string& name) override {
    return name == "seg" ? region_ : nullptr;
  }
  void DeliverNotification(const Notification&) override { notifications_.fetch_add(1); }
  void AddBytesServed(uint64_t) override {}

  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (memory_[i] != kGuard || memory_[kGuardBytes + kSegmentBytes + i] != kGuard) return false;
    }
    return true;
  }

 private:
  std::string name_ = "fuzz";
  std::vector<uint8_t> memory_;
  std::shared_ptr<LocalRegion> region_;
  std::atomic<int> notifications_{0};
};

struct Fixture {
  OneSegmentHost host;
  std::unique_ptr<TcpServer> server;
  Fixture() {
    InstallClusterToken(*ClusterToken::FromSecret("fuzz-cluster-token-0123"));
    auto s = TcpServer::Start(&host, "127.0.0.1", 0);
    TANDEM_FUZZ_CHECK(s.ok());
    server = std::move(*s);
  }
};

Fixture& GetFixture() {
  static Fixture* f = new Fixture();
  return *f;
}

// connect() that survives libFuzzer's periodic SIGALRM (installed without SA_RESTART): an
// interrupted connect goes on in the background, so wait for it and read its outcome.
// Any other failure is printed with its errno before the caller's check aborts.
bool ConnectInterruptible(int fd, const sockaddr_in& addr) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return true;
  int error = errno;
  if (error == EINTR) {
    for (;;) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, 10000);
      if (ready < 0 && errno == EINTR) continue;
      if (ready != 1) {
        error = ETIMEDOUT;
        break;
      }
      socklen_t len = sizeof(error);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      break;
    }
    if (error == 0) return true;
  }
  std::fprintf(stderr, "fuzz: connect to the listener failed: %s\n", std::strerror(error));
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& fx = GetFixture();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TANDEM_FUZZ_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(fx.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TANDEM_FUZZ_CHECK(ConnectInterruptible(fd, addr));
  if (size == 0) {
    ::close(fd);
    return 0;
  }
  const bool member = data[0] % 2 == 0;
  ++data;
  --size;
  if (member) {
    // The initiator's side of the handshake (transfer/tcp_handshake.cc), blocking.
    namespace hs = tcp_handshake;
    const std::string mine(hs::kNonceBytes, 'i');
    const std::string hello = std::string(hs::kHelloMagic, sizeof(hs::kHelloMagic)) + mine;
    TANDEM_FUZZ_CHECK(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) ==
                      static_cast<ssize_t>(hello.size()));
    std::string challenge(hs::kChallengeBytes, '\0');
    for (size_t got = 0; got < challenge.size();) {
      const ssize_t n = ::recv(fd, challenge.data() + got, challenge.size() - got, 0);
      if (n < 0 && errno == EINTR) continue;
      TANDEM_FUZZ_CHECK(n > 0);
      got += static_cast<size_t>(n);
    }
    const std::string theirs = challenge.substr(0, hs::kNonceBytes);
    const ClusterToken& token = *InstalledClusterToken();
    TANDEM_FUZZ_CHECK(challenge.substr(hs::kNonceBytes) == hs::TargetProof(token, mine, theirs));
    const std::string proof = hs::InitiatorProof(token, mine, theirs);
    TANDEM_FUZZ_CHECK(::send(fd, proof.data(), proof.size(), MSG_NOSIGNAL) ==
                      static_cast<ssize_t>(proof.size()));
  }
  // The server may close early (bad framing) while we still send: ignore EPIPE.
  // libFuzzer's timeout alarm (SIGALRM) interrupts blocking calls: EINTR is retried.
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // The server must close its side: the peer said all it had to say.
  char buf[64 << 10];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 10000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) {  // 10 s without a byte or EOF: a hang
      std::fprintf(stderr, "fuzz: no reply or close in 10 s; %d connections being served\n",
                   fx.server->active_connections());
      TANDEM_FUZZ_CHECK(false);
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  // Closed with a reset: the server closed first, and its TIME-WAIT entries would otherwise
  // pile up by the ten thousand and collide with new connections from the same ports.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
  // The connection's thread has ended before the next input (and before the leak check, which
  // would otherwise see the state of a thread still starting as unreferenced).
  for (int waited_ms = 0; fx.server->active_connections() > 0; ++waited_ms) {
    TANDEM_FUZZ_CHECK(waited_ms < 10000);
    ::usleep(1000);
  }
  TANDEM_FUZZ_CHECK(fx.host.GuardsIntact());
  return 0;
}
