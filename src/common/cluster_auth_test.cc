#include "common/cluster_auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

namespace tandem {
namespace {

ClusterToken Token(const std::string& secret) {
  auto t = ClusterToken::FromSecret(secret);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *t;
}

TEST(ClusterTokenTest, SecretsAreLongEnoughAndFilesPrivate) {
  EXPECT_EQ(ClusterToken::FromSecret("short").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterToken::Generate().secret().size(), 64u);  // 32 bytes, hex
  EXPECT_NE(ClusterToken::Generate().secret(), ClusterToken::Generate().secret());

  const std::string path = ::testing::TempDir() + "/cluster_token";
  std::ofstream(path) << "0123456789abcdef0123\n";
  ::chmod(path.c_str(), 0644);
  EXPECT_EQ(ClusterToken::FromFile(path).status().code(), StatusCode::kFailedPrecondition);
  ::chmod(path.c_str(), 0600);
  auto t = ClusterToken::FromFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->secret(), "0123456789abcdef0123");  // the trailing newline is not part of it
  std::remove(path.c_str());
  EXPECT_EQ(ClusterToken::FromFile(path).status().code(), StatusCode::kNotFound);
}

// The MAC is the standard HMAC-SHA256 over the parts framed as "<len>:<part>": the expected
// digest is Python's, hmac.new(b"Jefe-and-more-bytes", b"5:label3:abc", hashlib.sha256)
// (tests/disagg/cluster_auth.py signs the same way).
TEST(ClusterTokenTest, MacIsHmacSha256OverLengthPrefixedParts) {
  const ClusterToken t = Token("Jefe-and-more-bytes");
  EXPECT_EQ(HexEncode(t.Mac("label", {"abc"})),
            "1d6ceed542e649cc70f53a55bff864583250c33775d56de187c46cd4262b0d48");
  // Framing: moving a byte between parts changes the MAC.
  EXPECT_NE(t.Mac("label", {"ab", "c"}), t.Mac("label", {"a", "bc"}));
}

TEST(CallVerifierTest, AcceptsOnlyFreshUntamperedCallsWithTheToken) {
  const ClusterToken token = Token("the-cluster-secret-1");
  const ClusterToken other = Token("the-cluster-secret-2");
  CallVerifier v;
  std::string nonce;
  const SignedCall call = SignCall(token, "POST", "/v1/role", R"({"role":"decode"})");
  EXPECT_TRUE(BodyMatchesCall(call.header, R"({"role":"decode"})"));
  EXPECT_FALSE(BodyMatchesCall(call.header, R"({"role":"prefill"})"));

  // Wrong token, other method or path: refused (and the nonce is not consumed).
  EXPECT_EQ(v.Verify(other, call.header, "POST", "/v1/role", &nonce).code(),
            StatusCode::kUnauthenticated);
  EXPECT_FALSE(v.Verify(token, call.header, "GET", "/v1/role", &nonce).ok());
  EXPECT_FALSE(v.Verify(token, call.header, "POST", "/v1/prefill", &nonce).ok());
  ASSERT_TRUE(v.Verify(token, call.header, "POST", "/v1/role", &nonce).ok());
  EXPECT_EQ(nonce, call.nonce);
  // The same proof again: a replay.
  const Status replay = v.Verify(token, call.header, "POST", "/v1/role", &nonce);
  EXPECT_EQ(replay.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(replay.message().find("replayed"), std::string::npos);

  // A changed body hash breaks the MAC; garbage is malformed; nothing is no proof.
  std::string tampered = call.header;
  tampered[tampered.size() - 70] = tampered[tampered.size() - 70] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(v.Verify(token, tampered, "POST", "/v1/role", &nonce).ok());
  EXPECT_FALSE(v.Verify(token, "1.2.3.4", "POST", "/v1/role", &nonce).ok());
  EXPECT_FALSE(v.Verify(token, "", "POST", "/v1/role", &nonce).ok());

  // A proof made far from the server's clock is stale: forge one signed 10 minutes ago.
  const std::string ms = std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          (std::chrono::system_clock::now() - std::chrono::minutes(10)).time_since_epoch())
          .count());
  const std::string n = std::string(32, 'a');
  const std::string hash(64, '0');
  const std::string mac = HexEncode(token.Mac("tandem-call-v1", {"POST", "/v1/role", ms, n, hash}));
  const Status stale =
      v.Verify(token, ms + "." + n + "." + hash + "." + mac, "POST", "/v1/role", &nonce);
  EXPECT_NE(stale.message().find("time window"), std::string::npos) << stale.ToString();

  EXPECT_EQ(ReplyProof(token, call.nonce), ReplyProof(token, call.nonce));
  EXPECT_NE(ReplyProof(token, call.nonce), ReplyProof(other, call.nonce));
}

TEST(TcpHandshakeTest, ProofsBindBothNoncesAndTheDirection) {
  const ClusterToken token = Token("the-cluster-secret-1");
  const std::string a(16, 'a'), b(16, 'b');
  EXPECT_EQ(tcp_handshake::TargetProof(token, a, b).size(), tcp_handshake::kMacBytes);
  EXPECT_NE(tcp_handshake::TargetProof(token, a, b), tcp_handshake::InitiatorProof(token, a, b));
  EXPECT_NE(tcp_handshake::TargetProof(token, a, b), tcp_handshake::TargetProof(token, b, a));
}

}  // namespace
}  // namespace tandem
