// Cluster authentication: every process of one cluster holds the same secret, the cluster
// token, and it never travels on the wire. Each side of an exchange proves it holds the token
// with an HMAC-SHA256 (OpenSSL's libcrypto) over the exchange and fresh nonces, so that a peer
// without the token can neither call nor answer, and a recorded exchange cannot be replayed.
//   - HTTP between processes (worker control, metadata service, pool master): the caller signs
//     method, path, time, nonce and the body's SHA-256 (SignCall); the server checks the
//     signature when the headers arrive (CallVerifier, which also refuses a nonce seen within
//     the time window), the body against its signed hash once read (BodyMatchesCall), and
//     answers with a proof over the caller's nonce (ReplyProof), which the caller checks.
//     common/http.h does both sides.
//   - TCP transport: a challenge-response on each new connection (TcpHandshake below), before
//     any byte of a segment can be read or written.
// Authentication only: payloads travel in clear (run the cluster on a private network).
//
// The token is process configuration, like the logger: installed once at start, before any
// thread that talks to peers (InstallClusterToken). Without one nothing is signed or checked.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "common/status.h"

namespace tandem {

class ClusterToken {
 public:
  static constexpr size_t kMinSecretBytes = 16;

  // InvalidArgument when shorter than kMinSecretBytes.
  static StatusOr<ClusterToken> FromSecret(std::string secret);
  // The file's contents without trailing whitespace; the file must not be readable by others
  // (FailedPrecondition otherwise, as ssh does for keys).
  static StatusOr<ClusterToken> FromFile(const std::string& path);
  // 32 random bytes, hex-encoded (fit for an environment variable).
  static ClusterToken Generate();

  const std::string& secret() const { return secret_; }
  // HMAC-SHA256 over `label` and `parts`, each length-prefixed (no two inputs collide): 32 bytes.
  std::string Mac(std::string_view label, std::initializer_list<std::string_view> parts) const;

 private:
  explicit ClusterToken(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

// The process's token (nullopt: none). Install before starting threads that use it; the
// pointer InstalledClusterToken returns stays valid until the next install.
void InstallClusterToken(std::optional<ClusterToken> token);
const ClusterToken* InstalledClusterToken();
// The environment variable `tandem serve` hands its workers the token in, and that any tandem
// process reads when no --cluster-token-file is given.
inline constexpr char kClusterTokenEnv[] = "TANDEM_CLUSTER_TOKEN";
// Installs the token from `file` (non-empty), else from $TANDEM_CLUSTER_TOKEN, else none.
// Returns whether one was installed.
StatusOr<bool> InstallClusterTokenFrom(const std::string& file);

// Peers refused (bad, missing, stale or replayed proofs), in this process, all endpoints.
uint64_t ClusterAuthRefusals();
void CountClusterAuthRefusal();

std::string RandomBytes(size_t n);  // from the OS's generator (OpenSSL RAND_bytes)
std::string HexEncode(std::string_view bytes);
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// ---- HTTP calls ------------------------------------------------------------------------------

inline constexpr char kAuthHeader[] = "X-Tandem-Auth";  // caller: "ms.nonce.body_sha256.mac"
inline constexpr char kAuthReplyHeader[] = "X-Tandem-Auth-Reply";  // server: hex proof
// How far a call's time may be from the server's clock, either way.
inline constexpr std::chrono::seconds kCallClockSkew{60};

struct SignedCall {
  std::string header;  // the value of kAuthHeader
  std::string nonce;   // hex; the reply's proof is over it
};
SignedCall SignCall(const ClusterToken& token, std::string_view method, std::string_view path,
                    std::string_view body);
// The value of kAuthReplyHeader for a call that carried `nonce`.
std::string ReplyProof(const ClusterToken& token, std::string_view nonce);

// Whether `body` is the one the call's proof `header` signed (its SHA-256); the header itself
// is checked by CallVerifier.
bool BodyMatchesCall(std::string_view header, std::string_view body);

// Checks signed calls for one server. Thread-safe.
class CallVerifier {
 public:
  // OK and *nonce set when `header` proves the token for this method and path; Unauthenticated
  // naming why otherwise (missing, malformed, clock skew beyond kCallClockSkew, replayed,
  // wrong). The body is checked apart (BodyMatchesCall): servers read it after the headers.
  Status Verify(const ClusterToken& token, std::string_view header, std::string_view method,
                std::string_view path, std::string* nonce) TANDEM_EXCLUDES(mu_);

 private:
  // Nonces accepted within the window, by their expiry (unix ms); pruned as calls come.
  Mutex mu_;
  std::multimap<int64_t, std::string> by_expiry_ TANDEM_GUARDED_BY(mu_);
  std::set<std::string> seen_ TANDEM_GUARDED_BY(mu_);
};

// ---- TCP transport handshake -----------------------------------------------------------------
// initiator -> target: kHelloMagic | initiator nonce (16)
// target -> initiator: target nonce (16) | Mac("tcp-target", both nonces) (32)
// initiator -> target: Mac("tcp-initiator", both nonces) (32)
// Each side checks the other's MAC before trusting anything further on the connection.
namespace tcp_handshake {
inline constexpr char kHelloMagic[4] = {'T', 'D', 'X', 'A'};
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kHelloBytes = sizeof(kHelloMagic) + kNonceBytes;
inline constexpr size_t kChallengeBytes = kNonceBytes + kMacBytes;

std::string TargetProof(const ClusterToken& token, std::string_view initiator_nonce,
                        std::string_view target_nonce);
std::string InitiatorProof(const ClusterToken& token, std::string_view initiator_nonce,
                           std::string_view target_nonce);
}  // namespace tcp_handshake

}  // namespace tandem
