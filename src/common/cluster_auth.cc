#include "common/cluster_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/check.h"

namespace tandem {
namespace {

std::atomic<uint64_t> g_refusals{0};
// Replaced only by InstallClusterToken (at start, before peers are contacted).
std::unique_ptr<const ClusterToken> g_token;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return HexEncode(std::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string CallMac(const ClusterToken& token, std::string_view method, std::string_view path,
                    std::string_view unix_ms, std::string_view nonce, std::string_view body_hash) {
  return HexEncode(token.Mac("tandem-call-v1", {method, path, unix_ms, nonce, body_hash}));
}

// The four dot-separated fields of a call's proof; false when there are not four.
bool SplitProof(std::string_view header, std::string_view fields[4]) {
  for (int i = 0; i < 3; ++i) {
    const size_t dot = header.find('.');
    if (dot == std::string_view::npos) return false;
    fields[i] = header.substr(0, dot);
    header.remove_prefix(dot + 1);
  }
  fields[3] = header;
  return header.find('.') == std::string_view::npos;
}

}  // namespace

StatusOr<ClusterToken> ClusterToken::FromSecret(std::string secret) {
  if (secret.size() < kMinSecretBytes) {
    return InvalidArgument("the cluster token must have at least " +
                           std::to_string(kMinSecretBytes) + " bytes (it has " +
                           std::to_string(secret.size()) + ")");
  }
  return ClusterToken(std::move(secret));
}

StatusOr<ClusterToken> ClusterToken::FromFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound("cannot read the cluster token file " + path);
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return FailedPrecondition("the cluster token file " + path +
                              " is accessible by others; chmod 600 it");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return NotFound("cannot read the cluster token file " + path);
  std::string secret = text.str();
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  StatusOr<ClusterToken> token = FromSecret(std::move(secret));
  if (!token.ok()) return token.status().WithContext(path);
  return token;
}

ClusterToken ClusterToken::Generate() { return ClusterToken(HexEncode(RandomBytes(32))); }

std::string ClusterToken::Mac(std::string_view label,
                              std::initializer_list<std::string_view> parts) const {
  std::string message;
  auto append = [&message](std::string_view part) {
    message += std::to_string(part.size());
    message += ':';
    message += part;
  };
  append(label);
  for (std::string_view part : parts) append(part);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  const unsigned char* mac =
      HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &out_len);
  TANDEM_CHECK(mac != nullptr && out_len == 32) << "HMAC-SHA256 failed";
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

void InstallClusterToken(std::optional<ClusterToken> token) {
  g_token = token ? std::make_unique<const ClusterToken>(std::move(*token)) : nullptr;
}

const ClusterToken* InstalledClusterToken() { return g_token.get(); }

StatusOr<bool> InstallClusterTokenFrom(const std::string& file) {
  if (!file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(ClusterToken token, ClusterToken::FromFile(file));
    InstallClusterToken(std::move(token));
    return true;
  }
  if (const char* env = std::getenv(kClusterTokenEnv); env != nullptr && *env != '\0') {
    StatusOr<ClusterToken> token = ClusterToken::FromSecret(env);
    if (!token.ok()) return token.status().WithContext(kClusterTokenEnv);
    InstallClusterToken(std::move(*token));
    return true;
  }
  InstallClusterToken(std::nullopt);
  return false;
}

uint64_t ClusterAuthRefusals() { return g_refusals.load(std::memory_order_relaxed); }
void CountClusterAuthRefusal() { g_refusals.fetch_add(1, std::memory_order_relaxed); }

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  TANDEM_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1)
      << "the random generator failed";
  return out;
}

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

SignedCall SignCall(const ClusterToken& token, std::string_view method, std::string_view path,
                    std::string_view body) {
  SignedCall call;
  call.nonce = HexEncode(RandomBytes(16));
  const std::string ms = std::to_string(UnixMs());
  const std::string body_hash = Sha256Hex(body);
  call.header = ms + "." + call.nonce + "." + body_hash + "." +
                CallMac(token, method, path, ms, call.nonce, body_hash);
  return call;
}

std::string ReplyProof(const ClusterToken& token, std::string_view nonce) {
  return HexEncode(token.Mac("tandem-reply-v1", {nonce}));
}

bool BodyMatchesCall(std::string_view header, std::string_view body) {
  std::string_view fields[4];
  return SplitProof(header, fields) && ConstantTimeEqual(fields[2], Sha256Hex(body));
}

Status CallVerifier::Verify(const ClusterToken& token, std::string_view header,
                            std::string_view method, std::string_view path, std::string* nonce) {
  if (header.empty()) {
    return Unauthenticated("no cluster token proof (" + std::string(kAuthHeader) + ")");
  }
  std::string_view fields[4];
  if (header.size() > 256 || !SplitProof(header, fields)) {
    return Unauthenticated("malformed cluster token proof");
  }
  const std::string ms_text(fields[0]);
  const std::string_view call_nonce = fields[1];
  char* end = nullptr;
  const long long ms = std::strtoll(ms_text.c_str(), &end, 10);
  if (ms_text.empty() || end != ms_text.c_str() + ms_text.size() || call_nonce.size() != 32) {
    return Unauthenticated("malformed cluster token proof");
  }
  if (!ConstantTimeEqual(fields[3], CallMac(token, method, path, ms_text, call_nonce, fields[2]))) {
    return Unauthenticated("wrong cluster token proof");
  }
  const int64_t now = UnixMs();
  const int64_t skew_ms = std::chrono::milliseconds(kCallClockSkew).count();
  if (ms < now - skew_ms || ms > now + skew_ms) {
    return Unauthenticated("cluster token proof outside the time window (clock skew > " +
                           std::to_string(kCallClockSkew.count()) + " s?)");
  }
  MutexLock lock(&mu_);
  while (!by_expiry_.empty() && by_expiry_.begin()->first < now) {
    seen_.erase(by_expiry_.begin()->second);
    by_expiry_.erase(by_expiry_.begin());
  }
  std::string key(call_nonce);
  if (!seen_.insert(key).second) return Unauthenticated("replayed call (nonce seen before)");
  // Remembered until the call's time leaves the window: replays after that are stale.
  by_expiry_.emplace(ms + skew_ms, key);
  *nonce = std::move(key);
  return OkStatus();
}

namespace tcp_handshake {

std::string TargetProof(const ClusterToken& token, std::string_view initiator_nonce,
                        std::string_view target_nonce) {
  return token.Mac("tcp-target-v1", {initiator_nonce, target_nonce});
}

std::string InitiatorProof(const ClusterToken& token, std::string_view initiator_nonce,
                           std::string_view target_nonce) {
  return token.Mac("tcp-initiator-v1", {initiator_nonce, target_nonce});
}

}  // namespace tcp_handshake
}  // namespace tandem
