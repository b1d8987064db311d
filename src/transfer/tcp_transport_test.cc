// The TCP listener as seen by a raw client: it checks every request against the segment before
// any byte lands, answers errors in-band, and drops connections that lose the framing.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/cluster_auth.h"
#include "transfer/tcp_transport_wire_internal.h"
#include "transfer/transfer_engine.h"
#include "transfer/transfer_test_util.h"
#include "transfer/transfer_util_internal.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) {
    auto hp = ParseEndpoint(endpoint);
    EXPECT_TRUE(hp.ok());
    auto fd = StartConnect(hp->first, hp->second);
    EXPECT_TRUE(fd.ok());
    fd_ = std::move(*fd);
    EXPECT_TRUE(FinishConnect(fd_.get(), Clock::now() + 2s).ok());
  }

  bool Send(const std::string& bytes) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    int err = 0;
    return SendAll(
               fd_.get(), &iov, 1, [] { return false; }, &err) == IoResult::kOk;
  }

  static std::string Request(wire::MsgType type, uint64_t id, const std::string& segment,
                             uint64_t offset, uint64_t length, const std::string& payload = {}) {
    wire::Header h;
    h.type = type;
    h.id = id;
    h.offset = offset;
    h.length = length;
    h.name_len = static_cast<uint32_t>(segment.size());
    uint8_t hb[wire::kHeaderBytes];
    wire::Encode(h, hb);
    return std::string(reinterpret_cast<char*>(hb), sizeof(hb)) + segment + payload;
  }

  // Reads one reply (header + error text + payload); false on EOF or after 2 s.
  bool ReadReply(wire::Header* h, std::string* text, std::string* payload) {
    const auto limit = Clock::now() + 2s;
    auto late = [&] { return Clock::now() > limit; };
    uint8_t hb[wire::kHeaderBytes];
    int err = 0;
    if (RecvExact(fd_.get(), hb, sizeof(hb), late, &err) != IoResult::kOk) return false;
    if (!wire::Decode(hb, h)) return false;
    text->assign(h->name_len, '\0');
    if (RecvExact(fd_.get(), text->data(), text->size(), late, &err) != IoResult::kOk) return false;
    payload->assign(h->length, '\0');
    return RecvExact(fd_.get(), payload->data(), payload->size(), late, &err) == IoResult::kOk;
  }

  // The initiator's side of the cluster token handshake, with `token` (common/cluster_auth.h);
  // false when the target closes or (with check_target) does not prove the same token.
  bool Handshake(const ClusterToken& token, bool check_target = true) {
    namespace hs = tcp_handshake;
    const std::string mine(hs::kNonceBytes, 'n');
    if (!Send(std::string(hs::kHelloMagic, sizeof(hs::kHelloMagic)) + mine)) return false;
    std::string challenge(hs::kChallengeBytes, '\0');
    auto late = [limit = Clock::now() + 2s] { return Clock::now() > limit; };
    int err = 0;
    if (RecvExact(fd_.get(), challenge.data(), challenge.size(), late, &err) != IoResult::kOk) {
      return false;
    }
    const std::string theirs = challenge.substr(0, hs::kNonceBytes);
    if (check_target && challenge.substr(hs::kNonceBytes) != hs::TargetProof(token, mine, theirs)) {
      return false;
    }
    return Send(hs::InitiatorProof(token, mine, theirs));
  }

  // True once the server closed the connection (within 2 s).
  bool Closed() {
    char c;
    auto late = [limit = Clock::now() + 2s] { return Clock::now() > limit; };
    int err = 0;
    return RecvExact(fd_.get(), &c, 1, late, &err) == IoResult::kClosed;
  }

 private:
  UniqueFd fd_;
};

TEST(TcpListener, ValidatesEveryRequestBeforeTouchingMemory) {
  auto meta = testing::FreshEmbeddedStore();
  auto e = testing::MakeEngine("listener", meta);
  ASSERT_NE(e, nullptr);
  auto seg = e->AllocateSegment("listener/kv", 8192);
  ASSERT_TRUE(seg.ok());
  auto* mem = static_cast<uint8_t*>(*seg);
  auto desc = SegmentDescriptor::FromJson(*meta->Get("tandem/segments/listener/kv"));
  ASSERT_TRUE(desc.ok());
  RawClient c(desc->tcp_endpoint);

  // Out of range: refused in-band, the payload is drained, nothing lands.
  const std::string junk(100, 'j');
  ASSERT_TRUE(c.Send(RawClient::Request(wire::MsgType::kWrite, 1, "listener/kv", 8150, 100, junk)));
  wire::Header h;
  std::string text, payload;
  ASSERT_TRUE(c.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.id, 1u);
  EXPECT_EQ(h.code, static_cast<uint8_t>(StatusCode::kOutOfRange));
  EXPECT_NE(text.find("outside segment"), std::string::npos) << text;
  for (int i = 8100; i < 8192; ++i) ASSERT_EQ(mem[i], 0);

  // Unknown segment.
  ASSERT_TRUE(c.Send(RawClient::Request(wire::MsgType::kRead, 2, "nobody/kv", 0, 16)));
  ASSERT_TRUE(c.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.code, static_cast<uint8_t>(StatusCode::kNotFound));
  EXPECT_TRUE(payload.empty());

  // Zero length is refused too.
  ASSERT_TRUE(c.Send(RawClient::Request(wire::MsgType::kRead, 3, "listener/kv", 0, 0)));
  ASSERT_TRUE(c.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.code, static_cast<uint8_t>(StatusCode::kOutOfRange));

  // The same connection still serves valid requests: write, then read back.
  ASSERT_TRUE(
      c.Send(RawClient::Request(wire::MsgType::kWrite, 4, "listener/kv", 8187, 5, "hello")));
  ASSERT_TRUE(c.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.id, 4u);
  EXPECT_EQ(h.code, 0);
  EXPECT_EQ(std::memcmp(mem + 8187, "hello", 5), 0);
  ASSERT_TRUE(c.Send(RawClient::Request(wire::MsgType::kRead, 5, "listener/kv", 8187, 5)));
  ASSERT_TRUE(c.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.code, 0);
  EXPECT_EQ(payload, "hello");
  EXPECT_EQ(e->Counters().bytes_served, 10u);

  // Garbage framing: the listener closes the connection, and keeps accepting others.
  ASSERT_TRUE(c.Send(std::string(wire::kHeaderBytes, '\x7f')));
  EXPECT_TRUE(c.Closed());
  RawClient c2(desc->tcp_endpoint);
  ASSERT_TRUE(c2.Send(RawClient::Request(wire::MsgType::kRead, 6, "listener/kv", 8187, 5)));
  ASSERT_TRUE(c2.ReadReply(&h, &text, &payload));
  EXPECT_EQ(payload, "hello");
  // An oversized name is a framing error as well.
  wire::Header big;
  big.type = wire::MsgType::kRead;
  big.length = 1;
  big.name_len = wire::kMaxNameBytes + 1;
  uint8_t hb[wire::kHeaderBytes];
  wire::Encode(big, hb);
  ASSERT_TRUE(c2.Send(std::string(reinterpret_cast<char*>(hb), sizeof(hb))));
  EXPECT_TRUE(c2.Closed());
}

TEST(TcpWire, HeaderRoundTripAndRejects) {
  wire::Header h;
  h.type = wire::MsgType::kNotify;
  h.code = 9;
  h.id = 0x0102030405060708ull;
  h.offset = 1ull << 40;
  h.length = 77;
  h.name_len = 12;
  h.from_len = 3;
  uint8_t b[wire::kHeaderBytes];
  wire::Encode(h, b);
  EXPECT_EQ(b[0], 'T');  // little-endian magic "TDX1"
  wire::Header back;
  ASSERT_TRUE(wire::Decode(b, &back));
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.code, h.code);
  EXPECT_EQ(back.id, h.id);
  EXPECT_EQ(back.offset, h.offset);
  EXPECT_EQ(back.length, h.length);
  EXPECT_EQ(back.name_len, h.name_len);
  EXPECT_EQ(back.from_len, h.from_len);
  b[4] = 9;  // unknown type
  EXPECT_FALSE(wire::Decode(b, &back));
  b[4] = 1;
  b[0] = 'X';  // wrong magic
  EXPECT_FALSE(wire::Decode(b, &back));
}

TEST(TcpEndpoint, Parse) {
  auto a = ParseEndpoint("127.0.0.1:80");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 80);
  auto b = ParseEndpoint("[::1]:9000");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  EXPECT_EQ(b->second, 9000);
  for (const char* bad : {"", "host", ":80", "h:0", "h:65536", "h:8x", "[::1]80", "h:"}) {
    EXPECT_EQ(ParseEndpoint(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// With a cluster token, a peer that does not prove it can neither write nor read a segment:
// the listener closes its connection before looking at a single request.
TEST(TcpListener, RequiresTheClusterTokenWhenOneIsInstalled) {
  const ClusterToken token = *ClusterToken::FromSecret("listener-test-secret");
  InstallClusterToken(token);
  auto meta = testing::FreshEmbeddedStore();
  auto target = testing::MakeEngine("auth-t", meta);
  auto init = testing::MakeEngine("auth-i", meta, {Protocol::kTcp});
  ASSERT_TRUE(target && init);
  auto seg = target->AllocateSegment("auth-t/kv", 4096);
  ASSERT_TRUE(seg.ok());
  auto* mem = static_cast<uint8_t*>(*seg);
  auto desc = SegmentDescriptor::FromJson(*meta->Get("tandem/segments/auth-t/kv"));
  ASSERT_TRUE(desc.ok());
  const std::string write =
      RawClient::Request(wire::MsgType::kWrite, 1, "auth-t/kv", 0, 5, "hello");
  const std::string read = RawClient::Request(wire::MsgType::kRead, 2, "auth-t/kv", 0, 16);

  RawClient bare(desc->tcp_endpoint);  // no handshake: straight to a write
  ASSERT_TRUE(bare.Send(write));
  EXPECT_TRUE(bare.Closed());
  RawClient reader(desc->tcp_endpoint);  // no handshake: a read gets nothing back
  ASSERT_TRUE(reader.Send(read));
  EXPECT_TRUE(reader.Closed());
  const ClusterToken other = *ClusterToken::FromSecret("some-other-secret-x");
  RawClient checks(desc->tcp_endpoint);  // another token: the target's proof does not check
  EXPECT_FALSE(checks.Handshake(other));
  RawClient wrong(desc->tcp_endpoint);  // and the target refuses a proof made with it
  ASSERT_TRUE(wrong.Handshake(other, /*check_target=*/false));
  ASSERT_TRUE(wrong.Send(write));
  EXPECT_TRUE(wrong.Closed());
  for (int i = 0; i < 16; ++i) ASSERT_EQ(mem[i], 0);

  RawClient good(desc->tcp_endpoint);
  ASSERT_TRUE(good.Handshake(token));
  ASSERT_TRUE(good.Send(write));
  wire::Header h;
  std::string text, payload;
  ASSERT_TRUE(good.ReadReply(&h, &text, &payload));
  EXPECT_EQ(h.code, 0) << text;
  EXPECT_EQ(std::memcmp(mem, "hello", 5), 0);

  // The engine's own TCP transport does the handshake: a batch completes.
  std::vector<uint8_t> local(64, 7);
  ASSERT_TRUE(init->RegisterLocalMemory(local.data(), local.size()).ok());
  auto handle = init->OpenSegment("auth-t/kv");
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  TransferRequest r{OpCode::kWrite, local.data(), *handle, 100, local.size()};
  auto id = init->SubmitBatch({&r, 1}, Clock::now() + 5s);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(init->WaitBatch(*id).state, TransferState::kCompleted);
  EXPECT_EQ(mem[100], 7);
  EXPECT_GE(ClusterAuthRefusals(), 3u);
  InstallClusterToken(std::nullopt);
}

}  // namespace
}  // namespace tandem::transfer
