// The TCP transport's cluster authentication (common/cluster_auth.h: tcp_handshake has the
// messages): run on each new connection by both sides before any transfer message.
#include <sys/uio.h>

#include <cstring>
#include <string>

#include "common/cluster_auth.h"
#include "transfer/transfer_util_internal.h"

namespace tandem::transfer {
namespace {

namespace hs = tcp_handshake;

Status IoStatus(IoResult r, int err, const char* step) {
  switch (r) {
    case IoResult::kOk: return OkStatus();
    case IoResult::kAborted:
      return DeadlineExceeded(std::string("handshake: ") + step + " timed out");
    case IoResult::kClosed:
      return Unauthenticated(std::string("handshake: peer closed at ") + step);
    case IoResult::kError: break;
  }
  return Unavailable(std::string("handshake: ") + step + ": " + std::strerror(err));
}

Status Send(int fd, const std::string& bytes, const std::function<bool()>& abort,
            const char* step) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  int err = 0;
  return IoStatus(SendAll(fd, &iov, 1, abort, &err), err, step);
}

Status Recv(int fd, std::string* bytes, size_t n, const std::function<bool()>& abort,
            const char* step) {
  bytes->resize(n);
  int err = 0;
  return IoStatus(RecvExact(fd, bytes->data(), n, abort, &err), err, step);
}

}  // namespace

Status InitiatorHandshake(int fd, const std::function<bool()>& should_abort) {
  const ClusterToken* token = InstalledClusterToken();
  if (token == nullptr) return OkStatus();
  const std::string mine = RandomBytes(hs::kNonceBytes);
  TANDEM_RETURN_IF_ERROR(Send(fd, std::string(hs::kHelloMagic, sizeof(hs::kHelloMagic)) + mine,
                              should_abort, "hello"));
  std::string challenge;
  TANDEM_RETURN_IF_ERROR(Recv(fd, &challenge, hs::kChallengeBytes, should_abort, "challenge"));
  const std::string theirs = challenge.substr(0, hs::kNonceBytes);
  if (!ConstantTimeEqual(challenge.substr(hs::kNonceBytes),
                         hs::TargetProof(*token, mine, theirs))) {
    return Unauthenticated("the target did not prove it holds the cluster token");
  }
  return Send(fd, hs::InitiatorProof(*token, mine, theirs), should_abort, "proof");
}

Status TargetHandshake(int fd, const std::function<bool()>& should_abort) {
  const ClusterToken* token = InstalledClusterToken();
  if (token == nullptr) return OkStatus();
  std::string hello;
  TANDEM_RETURN_IF_ERROR(Recv(fd, &hello, hs::kHelloBytes, should_abort, "hello"));
  if (std::memcmp(hello.data(), hs::kHelloMagic, sizeof(hs::kHelloMagic)) != 0) {
    return Unauthenticated("the peer sent no cluster token handshake");
  }
  const std::string theirs = hello.substr(sizeof(hs::kHelloMagic));
  const std::string mine = RandomBytes(hs::kNonceBytes);
  TANDEM_RETURN_IF_ERROR(
      Send(fd, mine + hs::TargetProof(*token, theirs, mine), should_abort, "challenge"));
  std::string proof;
  TANDEM_RETURN_IF_ERROR(Recv(fd, &proof, hs::kMacBytes, should_abort, "proof"));
  if (!ConstantTimeEqual(proof, hs::InitiatorProof(*token, theirs, mine))) {
    return Unauthenticated("the initiator did not prove it holds the cluster token");
  }
  return OkStatus();
}

}  // namespace tandem::transfer
