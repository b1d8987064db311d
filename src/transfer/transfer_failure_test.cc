// Failures: a peer that never answers (deadlines), a peer process killed with SIGKILL or stopped
// with SIGSTOP in the middle of a batch, and the release of sockets and mappings afterwards.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "transfer/transfer_engine.h"
#include "transfer/transfer_test_util.h"
#include "transfer/transfer_util_internal.h"
#include "transfer/transport.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;
using testing::CountFds;
using testing::CountMapsLines;
using testing::CountSegmentMappings;
using testing::WaitFor;

// Slack allowed past a deadline for WaitBatch to return: the engine's reaping slack plus
// scheduling noise on a loaded machine.
constexpr auto kSlack = kReapSlack + 500ms;

// /proc/self/maps lines may differ by a few even without leaks: glibc keeps the stacks of ended
// threads in a cache and maps new ones in other places (2 lines each: stack and guard page), and
// may grow an allocator arena. Leaked threads (8 per peer), sockets' buffers or segment mappings
// would exceed this; segment mappings are also counted exactly.
// Sanitizers map shadow memory as threads come and go: there only segment mappings are counted.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kMapsChurn = 1 << 20;
#else
constexpr int kMapsChurn = 6;
#endif

bool AllTerminal(TransferEngine& e, BatchId id, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (e.GetRequestStatus(id, i).state == TransferState::kPending) return false;
  }
  return true;
}

TEST(Deadline, SilentPeerTimesOutWithinDeadline) {
  // A listener that accepts nothing and reads nothing: the kernel completes the handshake into
  // the backlog, small writes vanish into socket buffers, large ones stall.
  auto listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  auto meta = testing::FreshEmbeddedStore();
  SegmentDescriptor d;
  d.name = "silent/kv";
  d.owner = "silent";
  d.host_id = "elsewhere";
  d.size = 64 << 20;
  d.tcp_endpoint = "127.0.0.1:" + std::to_string(listener->second);
  ASSERT_TRUE(meta->Put("tandem/segments/silent/kv", d.ToJson()).ok());

  auto e = testing::MakeEngine("impatient", meta);
  ASSERT_NE(e, nullptr);
  std::vector<uint8_t> buf(32 << 20, 1);
  ASSERT_TRUE(e->RegisterLocalMemory(buf.data(), buf.size()).ok());
  auto h = e->OpenSegment("silent/kv");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(*e->SegmentProtocol(*h), Protocol::kTcp);

  std::vector<TransferRequest> reqs = {{OpCode::kWrite, buf.data(), *h, 0, 16 << 20},
                                       {OpCode::kWrite, buf.data(), *h, 0, 100},
                                       {OpCode::kRead, buf.data() + (16 << 20), *h, 0, 4096},
                                       {OpCode::kWrite, buf.data(), *h, 0, 30 << 10}};
  const auto start = Clock::now();
  const auto deadline = start + 300ms;
  auto id = e->SubmitBatch(reqs, deadline, "never");
  ASSERT_TRUE(id.ok());
  BatchStatus s = e->WaitBatch(*id);
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, 290ms);
  EXPECT_LE(waited, 300ms + kSlack)
      << "waited " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
      << " ms";
  EXPECT_EQ(s.state, TransferState::kTimedOut);
  EXPECT_EQ(s.timed_out, 4);
  EXPECT_EQ(s.first_error.code(), StatusCode::kDeadlineExceeded);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(e->GetRequestStatus(*id, i).state, TransferState::kTimedOut) << i;
  }
  EXPECT_EQ(e->Counters().requests_timed_out, 4u);
  EXPECT_EQ(e->Counters().notifications_sent, 0u);
  EXPECT_TRUE(e->FreeBatch(*id).ok());
}

TEST(Deadline, UnreachablePeerFailsFast) {
  // Nothing listens on the port: connection refused, not a timeout.
  auto listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const int port = listener->second;
  listener->first.Reset();
  auto meta = testing::FreshEmbeddedStore();
  SegmentDescriptor d;
  d.name = "closed/kv";
  d.owner = "closed";
  d.size = 1 << 20;
  d.tcp_endpoint = "127.0.0.1:" + std::to_string(port);
  ASSERT_TRUE(meta->Put("tandem/segments/closed/kv", d.ToJson()).ok());
  auto e = testing::MakeEngine("hopeful", meta);
  ASSERT_NE(e, nullptr);
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(e->RegisterLocalMemory(buf.data(), buf.size()).ok());
  auto h = e->OpenSegment("closed/kv");
  ASSERT_TRUE(h.ok());
  TransferRequest r{OpCode::kWrite, buf.data(), *h, 0, 4096};
  const auto start = Clock::now();
  auto id = e->SubmitBatch({&r, 1}, start + 5s);
  ASSERT_TRUE(id.ok());
  BatchStatus s = e->WaitBatch(*id);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_EQ(s.first_error.code(), StatusCode::kUnavailable) << s.first_error.ToString();
  EXPECT_EQ(e->Counters().requests_failed, 1u);
}

// A peer process owning a 64 MiB segment, reached through the HTTP metadata store served here.
class PeerProcessTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSegBytes = 64 << 20;

  void SetUp() override {
    auto server = MetadataHttpServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    uri_ = "http://127.0.0.1:" + std::to_string(server_->port());
    auto meta = OpenMetadataStore(uri_);
    ASSERT_TRUE(meta.ok()) << meta.status().ToString();
    meta_ = *meta;
    buf_.resize(8 << 20);
    testing::FillRandom(buf_.data(), buf_.size(), 11);
  }

  // Starts a peer owning "<name>/kv" of `size` bytes.
  std::unique_ptr<testing::PeerProcess> StartPeer(const std::string& name,
                                                  uint64_t size = kSegBytes) {
    return testing::PeerProcess::Start(uri_, name, name + "/kv", size);
  }

  // `count` 4 MiB writes cycling over `segment_bytes` of the segment. They overlap when they
  // cover more than that, so parallel connections may write one range at once: the tests using
  // that do not check the data, only how the requests end.
  std::vector<TransferRequest> BigWrites(SegmentHandle h, int count,
                                         uint64_t segment_bytes = kSegBytes) {
    const uint64_t slots = segment_bytes / (4ull << 20);
    std::vector<TransferRequest> reqs;
    for (int i = 0; i < count; ++i) {
      reqs.push_back({OpCode::kWrite, buf_.data(), h, (i % slots) * (4ull << 20), 4ull << 20});
    }
    return reqs;
  }

  int Fds() { return CountFds(server_->port()); }

  std::unique_ptr<MetadataHttpServer> server_;
  std::string uri_;
  std::shared_ptr<MetadataStore> meta_;
  std::vector<uint8_t> buf_;
};

// One complete round against a live peer, so that thread stacks and allocator arenas used by
// the transports exist before resources are counted.
void WarmUp(TransferEngine& e, const std::string& segment, void* local) {
  auto h = e.OpenSegment(segment);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::vector<TransferRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    reqs.push_back({OpCode::kWrite, local, *h, static_cast<uint64_t>(i) << 20, 1 << 20});
  }
  auto id = e.SubmitBatch(reqs, Clock::now() + 5s);
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(e.WaitBatch(*id).state, TransferState::kCompleted);
  ASSERT_TRUE(e.FreeBatch(*id).ok());
  ASSERT_TRUE(e.CloseSegment(*h).ok());
}

TEST_F(PeerProcessTest, TcpPeerKilledMidBatch) {
  auto peer = StartPeer("victim-tcp");
  ASSERT_NE(peer, nullptr);
  auto e = testing::MakeEngine("killer-tcp", meta_, {Protocol::kTcp});
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->RegisterLocalMemory(buf_.data(), buf_.size()).ok());
  WarmUp(*e, "victim-tcp/kv", buf_.data());
  ASSERT_TRUE(WaitFor([&] { return e->Counters().requests_completed == 16; }, 1s));
  std::this_thread::sleep_for(300ms);  // the janitor closes the warm-up connections
  const int fds_before = Fds();
  const int maps_before = CountMapsLines();

  auto h = e->OpenSegment("victim-tcp/kv");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(*e->SegmentProtocol(*h), Protocol::kTcp);
  auto reqs = BigWrites(*h, 256);  // 1 GiB: far more than loopback moves before the kill
  const auto start = Clock::now();
  const auto deadline = start + 8s;
  auto id = e->SubmitBatch(reqs, deadline, "kv-done");
  ASSERT_TRUE(id.ok());
  // Kill once data is flowing.
  ASSERT_TRUE(
      WaitFor([&] { return e->GetRequestStatus(*id, 0).state != TransferState::kPending; }, 5s));
  peer->Signal(SIGKILL);
  BatchStatus s = e->WaitBatch(*id);
  const auto waited = Clock::now() - start;
  EXPECT_LT(waited, 8s) << "a dead peer must fail requests at once, not at the deadline";
  EXPECT_EQ(s.pending, 0);
  EXPECT_EQ(s.completed + s.failed + s.timed_out, 256);
  EXPECT_GT(s.failed, 0);
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_EQ(s.first_error.code(), StatusCode::kUnavailable) << s.first_error.ToString();
  EXPECT_NE(s.first_error.message().find("127.0.0.1:"), std::string::npos)
      << "the reason names the peer: " << s.first_error.message();
  EXPECT_TRUE(AllTerminal(*e, *id, reqs.size()));
  const TransferCounters c = e->Counters();
  EXPECT_EQ(c.requests_failed, static_cast<uint64_t>(s.failed));
  EXPECT_EQ(c.notifications_sent, 0u);

  // Later requests to the dead peer fail fast (connection refused).
  auto again = e->SubmitBatch({&reqs[0], 1}, Clock::now() + 3s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(e->WaitBatch(*again).state, TransferState::kFailed);

  ASSERT_TRUE(e->FreeBatch(*id).ok());
  ASSERT_TRUE(e->FreeBatch(*again).ok());
  ASSERT_TRUE(e->CloseSegment(*h).ok());
  EXPECT_TRUE(WaitFor([&] { return Fds() == fds_before; }, 3s))
      << "fds before " << fds_before << ", after " << Fds();
  EXPECT_TRUE(WaitFor([&] { return CountMapsLines() <= maps_before + kMapsChurn; }, 3s))
      << "maps lines before " << maps_before << ", after " << CountMapsLines();
  EXPECT_EQ(CountSegmentMappings(), 0);
}

TEST_F(PeerProcessTest, ShmPeerKilledMidBatch) {
  // Copies run in parallel on the workers: keep their target ranges apart.
  constexpr uint64_t kShmSegBytes = 128 << 20;
  auto peer = StartPeer("victim-shm", kShmSegBytes);
  ASSERT_NE(peer, nullptr);
  auto e = testing::MakeEngine("killer-shm", meta_, {Protocol::kShm});
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->RegisterLocalMemory(buf_.data(), buf_.size()).ok());
  WarmUp(*e, "victim-shm/kv", buf_.data());
  const int fds_before = Fds();
  const int maps_before = CountMapsLines();
  const int seg_maps_before = CountSegmentMappings();

  auto h = e->OpenSegment("victim-shm/kv");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(*e->SegmentProtocol(*h), Protocol::kShm);
  EXPECT_EQ(CountSegmentMappings(), seg_maps_before + 1);
  auto reqs = BigWrites(*h, 32, kShmSegBytes);
  const auto start = Clock::now();
  auto id = e->SubmitBatch(reqs, start + 8s);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(
      WaitFor([&] { return e->GetRequestStatus(*id, 0).state != TransferState::kPending; }, 5s));
  peer->Signal(SIGKILL);
  BatchStatus s = e->WaitBatch(*id);
  EXPECT_LT(Clock::now() - start, 8s);
  // Our mapping keeps the dead peer's memory alive: the copies all land.
  EXPECT_EQ(s.state, TransferState::kCompleted) << s.first_error.ToString();
  EXPECT_EQ(s.completed, 32);
  EXPECT_TRUE(AllTerminal(*e, *id, reqs.size()));
  ASSERT_TRUE(e->FreeBatch(*id).ok());
  ASSERT_TRUE(e->CloseSegment(*h).ok());
  EXPECT_EQ(CountSegmentMappings(), seg_maps_before);
  EXPECT_TRUE(WaitFor([&] { return Fds() == fds_before; }, 3s))
      << "fds before " << fds_before << ", after " << Fds();
  EXPECT_TRUE(WaitFor([&] { return CountMapsLines() <= maps_before + kMapsChurn; }, 3s))
      << "maps lines before " << maps_before << ", after " << CountMapsLines();
}

TEST_F(PeerProcessTest, StoppedPeerTimesOutAndRecovers) {
  auto peer = StartPeer("sleeper");
  ASSERT_NE(peer, nullptr);
  auto e = testing::MakeEngine("waker", meta_, {Protocol::kTcp});
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->RegisterLocalMemory(buf_.data(), buf_.size()).ok());
  auto h = e->OpenSegment("sleeper/kv");
  ASSERT_TRUE(h.ok());
  peer->Signal(SIGSTOP);
  auto reqs = BigWrites(*h, 8);
  reqs.push_back({OpCode::kRead, buf_.data() + 4096, *h, 0, 4096});
  const auto start = Clock::now();
  auto id = e->SubmitBatch(reqs, start + 400ms, "late");
  ASSERT_TRUE(id.ok());
  BatchStatus s = e->WaitBatch(*id);
  const auto waited = Clock::now() - start;
  EXPECT_LE(waited, 400ms + kSlack)
      << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
  EXPECT_EQ(s.pending, 0);
  EXPECT_EQ(s.timed_out, static_cast<int>(reqs.size()));
  EXPECT_EQ(s.state, TransferState::kTimedOut);
  // Once the peer runs again, new requests go through on fresh connections. (Bytes of the
  // timed-out writes still in socket buffers may land meanwhile: a range written by a request
  // that did not complete holds unspecified data. This write stays clear of those ranges.)
  peer->Signal(SIGCONT);
  TransferRequest r{OpCode::kWrite, buf_.data(), *h, (40 << 20) + 123, 1 << 20};
  auto id2 = e->SubmitBatch({&r, 1}, Clock::now() + 5s);
  ASSERT_TRUE(id2.ok());
  BatchStatus s2 = e->WaitBatch(*id2);
  EXPECT_EQ(s2.state, TransferState::kCompleted) << s2.first_error.ToString();
}

TEST_F(PeerProcessTest, NotificationToDeadOwnerFailsTheBatch) {
  auto peer = StartPeer("mute");
  ASSERT_NE(peer, nullptr);
  auto e = testing::MakeEngine("speaker", meta_, {Protocol::kShm});
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->RegisterLocalMemory(buf_.data(), buf_.size()).ok());
  auto h = e->OpenSegment("mute/kv");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(*e->SegmentProtocol(*h), Protocol::kShm);
  peer->Signal(SIGKILL);
  // The data lands in the (still mapped) memory; the notification cannot be delivered.
  TransferRequest r{OpCode::kWrite, buf_.data(), *h, 0, 4096};
  auto id = e->SubmitBatch({&r, 1}, Clock::now() + 3s, "anyone?");
  ASSERT_TRUE(id.ok());
  BatchStatus s = e->WaitBatch(*id);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_NE(s.first_error.message().find("notification"), std::string::npos)
      << s.first_error.ToString();
  EXPECT_EQ(e->Counters().notifications_sent, 0u);
}

}  // namespace
}  // namespace tandem::transfer
