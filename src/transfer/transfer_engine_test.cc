// Transfer engine core: descriptors, registration and publication, transport choice, refusals
// at submit, batch bookkeeping.
#include "transfer/transfer_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "transfer/transfer_test_util.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;
using testing::FreshEmbeddedStore;
using testing::MakeEngine;

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

TEST(SegmentDescriptor, JsonRoundTrip) {
  SegmentDescriptor d;
  d.name = "decode-0/kv";
  d.owner = "decode-0";
  d.host_id = "abc";
  d.size = (uint64_t{5} << 32) + 7;
  d.owner_pid = 4242;
  d.shm_fd = 17;
  d.tcp_endpoint = "127.0.0.1:4000";
  d.ucx_address = "beef";
  auto back = SegmentDescriptor::FromJson(d.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->name, d.name);
  EXPECT_EQ(back->owner, d.owner);
  EXPECT_EQ(back->host_id, d.host_id);
  EXPECT_EQ(back->size, d.size);
  EXPECT_EQ(back->owner_pid, d.owner_pid);
  EXPECT_EQ(back->shm_fd, d.shm_fd);
  EXPECT_EQ(back->tcp_endpoint, d.tcp_endpoint);
  EXPECT_EQ(back->ucx_address, d.ucx_address);
}

TEST(SegmentDescriptor, RejectsGarbage) {
  EXPECT_EQ(SegmentDescriptor::FromJson("not json").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(SegmentDescriptor::FromJson("[1,2]").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(SegmentDescriptor::FromJson(R"({"name":"x"})").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(SegmentDescriptor::FromJson(R"({"name":"x","owner":"o","size":"big"})").status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(SegmentDescriptor::FromJson(R"({"name":"x","owner":"o","size":0})").status().code(),
            StatusCode::kDataLoss);
}

TEST(Protocol, NamesRoundTrip) {
  for (Protocol p : {Protocol::kShm, Protocol::kTcp, Protocol::kUcx}) {
    auto back = ParseProtocol(ProtocolName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(ParseProtocol("rdma").status().code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(TransferStateName(TransferState::kTimedOut), "timed_out");
}

TEST(TransferEngine, CreateRejectsBadOptions) {
  TransferEngineOptions o;
  o.metadata = FreshEmbeddedStore();
  EXPECT_EQ(TransferEngine::Create(o).status().code(), StatusCode::kInvalidArgument);  // no name
  o.local_name = "a";
  o.tcp_connections_per_peer = 0;
  EXPECT_EQ(TransferEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.tcp_connections_per_peer = 2;
  o.worker_threads = 0;
  EXPECT_EQ(TransferEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.worker_threads = 1;
  o.metadata = nullptr;
  EXPECT_EQ(TransferEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.metadata = FreshEmbeddedStore();
  o.tcp_listen_host = "203.0.113.1";  // not an address of this host
  EXPECT_FALSE(TransferEngine::Create(o).ok());
}

TEST(TransferEngine, AllocateSegmentPublishesDescriptor) {
  auto meta = FreshEmbeddedStore();
  auto a = MakeEngine("owner-a", meta);
  ASSERT_NE(a, nullptr);
  auto base = a->AllocateSegment("owner-a/kv", 100000);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  // Zeroed and writable.
  const auto* bytes = static_cast<const uint8_t*>(*base);
  for (size_t i = 0; i < 100000; i += 997) ASSERT_EQ(bytes[i], 0);
  std::memset(*base, 0x5a, 100000);

  auto json = meta->Get("tandem/segments/owner-a/kv");
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  auto d = SegmentDescriptor::FromJson(*json);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->name, "owner-a/kv");
  EXPECT_EQ(d->owner, "owner-a");
  EXPECT_EQ(d->host_id, BootId());
  EXPECT_EQ(d->size, 100000u);
  EXPECT_EQ(d->owner_pid, ::getpid());
  EXPECT_GE(d->shm_fd, 0);
  EXPECT_EQ(d->tcp_endpoint.rfind("127.0.0.1:", 0), 0u) << d->tcp_endpoint;

  EXPECT_EQ(a->AllocateSegment("owner-a/kv", 10).status().code(), StatusCode::kFailedPrecondition);
  auto b = MakeEngine("owner-b", meta);
  ASSERT_NE(b, nullptr);
  auto dup = b->AllocateSegment("owner-a/kv", 10);
  EXPECT_EQ(dup.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(dup.status().message().find("owner-a"), std::string::npos) << dup.status().message();
  EXPECT_EQ(a->AllocateSegment("", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->AllocateSegment("has space", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->AllocateSegment("zero", 0).status().code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(a->UnregisterSegment("owner-a/kv").ok());
  EXPECT_EQ(meta->Get("tandem/segments/owner-a/kv").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b->OpenSegment("owner-a/kv").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a->UnregisterSegment("owner-a/kv").code(), StatusCode::kNotFound);
}

TEST(TransferEngine, DestructionUnpublishesAndUnmaps) {
  auto meta = FreshEmbeddedStore();
  const int maps_before = testing::CountSegmentMappings();
  {
    auto a = MakeEngine("gone", meta);
    ASSERT_NE(a, nullptr);
    ASSERT_TRUE(a->AllocateSegment("gone/kv", 1 << 20).ok());
    EXPECT_EQ(testing::CountSegmentMappings(), maps_before + 1);
  }
  EXPECT_EQ(testing::CountSegmentMappings(), maps_before);
  EXPECT_EQ(meta->Get("tandem/segments/gone/kv").status().code(), StatusCode::kNotFound);
}

TEST(TransferEngine, ChoosesTransportByProtocolsAndHost) {
  auto meta = FreshEmbeddedStore();
  auto target = MakeEngine("t", meta);
  auto shm_first = MakeEngine("i1", meta, {Protocol::kShm, Protocol::kTcp});
  auto tcp_only = MakeEngine("i2", meta, {Protocol::kTcp});
  auto shm_only = MakeEngine("i3", meta, {Protocol::kShm});
  ASSERT_TRUE(target && shm_first && tcp_only && shm_only);
  ASSERT_TRUE(target->AllocateSegment("t/shm", 4096).ok());
  std::vector<char> own(8192);
  ASSERT_TRUE(target->RegisterSegment("t/plain", own.data(), own.size()).ok());

  auto h = shm_first->OpenSegment("t/shm");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*shm_first->SegmentProtocol(*h), Protocol::kShm);
  h = tcp_only->OpenSegment("t/shm");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*tcp_only->SegmentProtocol(*h), Protocol::kTcp);
  // Caller-owned memory has no memfd: only TCP reaches it.
  h = shm_first->OpenSegment("t/plain");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*shm_first->SegmentProtocol(*h), Protocol::kTcp);
  EXPECT_EQ(shm_only->OpenSegment("t/plain").status().code(), StatusCode::kUnavailable);

  // A descriptor from another host is not reachable over shm.
  SegmentDescriptor foreign;
  foreign.name = "elsewhere/kv";
  foreign.owner = "elsewhere";
  foreign.host_id = "another-boot-id";
  foreign.size = 4096;
  foreign.owner_pid = ::getpid();
  foreign.shm_fd = 0;
  foreign.tcp_endpoint = "127.0.0.1:9";
  ASSERT_TRUE(meta->Put("tandem/segments/elsewhere/kv", foreign.ToJson()).ok());
  h = shm_first->OpenSegment("elsewhere/kv");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*shm_first->SegmentProtocol(*h), Protocol::kTcp);
  EXPECT_EQ(shm_only->OpenSegment("elsewhere/kv").status().code(), StatusCode::kUnavailable);

  // A stale descriptor pointing at a file that is not the segment's memfd is not mapped.
  SegmentDescriptor stale = foreign;
  stale.name = "stale/kv";
  stale.host_id = BootId();
  stale.shm_fd = 1;  // stdout of this process
  ASSERT_TRUE(meta->Put("tandem/segments/stale/kv", stale.ToJson()).ok());
  auto s = shm_only->OpenSegment("stale/kv");
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("memfd"), std::string::npos) << s.status().message();

  EXPECT_EQ(shm_first->SegmentProtocol(SegmentHandle{999}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(shm_first->CloseSegment(SegmentHandle{999}).code(), StatusCode::kNotFound);
  EXPECT_EQ(shm_first->OpenSegment("nobody/kv").status().code(), StatusCode::kNotFound);
}

TEST(TransferEngine, LocalMemoryRegistration) {
  auto meta = FreshEmbeddedStore();
  auto a = MakeEngine("reg", meta);
  ASSERT_NE(a, nullptr);
  std::vector<char> buf(1 << 16);
  EXPECT_EQ(a->RegisterLocalMemory(nullptr, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->RegisterLocalMemory(buf.data(), 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->RegisterLocalMemory(buf.data(), 4096).ok());
  EXPECT_EQ(a->RegisterLocalMemory(buf.data() + 100, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->RegisterSegment("reg/overlap", buf.data() + 4000, 200).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->RegisterLocalMemory(buf.data() + 4096, 4096).ok());  // adjacent is fine
  EXPECT_EQ(a->UnregisterLocalMemory(buf.data() + 1).code(), StatusCode::kNotFound);
  ASSERT_TRUE(a->RegisterSegment("reg/seg", buf.data() + 8192, 4096).ok());
  EXPECT_EQ(a->UnregisterLocalMemory(buf.data() + 8192).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->UnregisterLocalMemory(buf.data()).ok());
  EXPECT_TRUE(a->UnregisterLocalMemory(buf.data() + 4096).ok());
  EXPECT_TRUE(a->UnregisterSegment("reg/seg").ok());
}

class SubmitRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = FreshEmbeddedStore();
    target_ = MakeEngine("ref-t", meta_);
    init_ = MakeEngine("ref-i", meta_);
    ASSERT_TRUE(target_ && init_);
    auto seg = target_->AllocateSegment("ref-t/kv", kSegBytes);
    ASSERT_TRUE(seg.ok());
    remote_mem_ = static_cast<uint8_t*>(*seg);
    ASSERT_TRUE(target_->AllocateSegment("ref-t/other", kSegBytes).ok());
    local_.assign(kLocalBytes, 0xab);
    ASSERT_TRUE(init_->RegisterLocalMemory(local_.data(), local_.size()).ok());
    auto h = init_->OpenSegment("ref-t/kv");
    ASSERT_TRUE(h.ok());
    seg_ = *h;
    h = init_->OpenSegment("ref-t/other");
    ASSERT_TRUE(h.ok());
    other_ = *h;
  }

  // Submits {valid request, bad} and checks the refusal, its counter and that nothing moved.
  void ExpectRefused(const TransferRequest& bad, StatusCode code, const std::string& words,
                     const std::string& notification = {}) {
    const uint64_t refused_before = init_->Counters().requests_refused;
    TransferRequest good{OpCode::kWrite, local_.data(), seg_, 0, 4096};
    std::vector<TransferRequest> batch = {good, bad};
    auto id = init_->SubmitBatch(batch, Clock::now() + 1s, notification);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), code) << id.status().ToString();
    EXPECT_NE(id.status().message().find(words), std::string::npos) << id.status().message();
    EXPECT_EQ(init_->Counters().requests_refused, refused_before + 2);
    std::this_thread::sleep_for(20ms);  // would be plenty for a 4 KiB copy to land
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(remote_mem_[i], 0) << "data moved at " << i;
  }

  static constexpr uint64_t kSegBytes = 1 << 20;
  static constexpr uint64_t kLocalBytes = 1 << 16;
  std::shared_ptr<MetadataStore> meta_;
  std::unique_ptr<TransferEngine> target_, init_;
  uint8_t* remote_mem_ = nullptr;
  std::vector<uint8_t> local_;
  SegmentHandle seg_, other_;
};

TEST_F(SubmitRefusals, ZeroLength) {
  ExpectRefused({OpCode::kWrite, local_.data(), seg_, 0, 0}, StatusCode::kInvalidArgument,
                "zero length");
}

TEST_F(SubmitRefusals, RemoteRangeOutsideSegment) {
  ExpectRefused({OpCode::kWrite, local_.data(), seg_, kSegBytes - 10, 11}, StatusCode::kOutOfRange,
                "outside segment");
  ExpectRefused({OpCode::kRead, local_.data(), seg_, kSegBytes + 1, 1}, StatusCode::kOutOfRange,
                "outside segment");
  // Offset + length overflowing 64 bits.
  ExpectRefused({OpCode::kWrite, local_.data(), seg_, ~uint64_t{0} - 2, 8}, StatusCode::kOutOfRange,
                "outside segment");
}

TEST_F(SubmitRefusals, LocalRangeNotRegistered) {
  std::vector<uint8_t> unregistered(4096);
  ExpectRefused({OpCode::kWrite, unregistered.data(), seg_, 0, 16}, StatusCode::kInvalidArgument,
                "not inside memory registered");
  // Starts inside, ends past the registration.
  ExpectRefused({OpCode::kWrite, local_.data() + kLocalBytes - 8, seg_, 0, 16},
                StatusCode::kInvalidArgument, "not inside memory registered");
  ExpectRefused({OpCode::kRead, nullptr, seg_, 0, 16}, StatusCode::kInvalidArgument, "null");
}

TEST_F(SubmitRefusals, UnknownHandle) {
  ExpectRefused({OpCode::kWrite, local_.data(), SegmentHandle{12345}, 0, 16}, StatusCode::kNotFound,
                "unknown segment handle");
  // A closed handle is unknown too.
  auto h = init_->OpenSegment("ref-t/kv");
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(init_->CloseSegment(*h).ok());
  ExpectRefused({OpCode::kWrite, local_.data(), *h, 0, 16}, StatusCode::kNotFound,
                "unknown segment handle");
}

TEST_F(SubmitRefusals, NotificationWithMixedSegments) {
  ExpectRefused({OpCode::kWrite, local_.data(), other_, 0, 16}, StatusCode::kInvalidArgument,
                "one segment", "done");
}

TEST_F(SubmitRefusals, EmptyBatchAndOversizedNotification) {
  auto id = init_->SubmitBatch({}, Clock::now() + 1s);
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  TransferRequest r{OpCode::kWrite, local_.data(), seg_, 0, 16};
  id = init_->SubmitBatch({&r, 1}, Clock::now() + 1s, std::string(100 << 10, 'x'));
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SubmitRefusals, SegmentMemoryCountsAsLocalMemory) {
  // The target writes from its own segment into the initiator's... own segment, loopback:
  // segment memory is registered local memory for its engine.
  auto h = target_->OpenSegment("ref-t/other");
  ASSERT_TRUE(h.ok());
  testing::FillRandom(remote_mem_, 1000, 7);
  TransferRequest r{OpCode::kWrite, remote_mem_, *h, 500, 1000};
  auto id = target_->SubmitBatch({&r, 1}, Clock::now() + 2s);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(target_->WaitBatch(*id).state, TransferState::kCompleted);
  EXPECT_TRUE(target_->FreeBatch(*id).ok());
}

TEST_F(SubmitRefusals, BatchBookkeeping) {
  TransferRequest r{OpCode::kWrite, local_.data(), seg_, 0, 4096};
  auto id = init_->SubmitBatch({&r, 1}, Clock::now() + 2s);
  ASSERT_TRUE(id.ok());
  BatchStatus s = init_->WaitBatch(*id);
  EXPECT_EQ(s.state, TransferState::kCompleted);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.pending, 0);
  EXPECT_TRUE(s.first_error.ok());
  RequestStatus rs = init_->GetRequestStatus(*id, 0);
  EXPECT_EQ(rs.state, TransferState::kCompleted);
  EXPECT_EQ(init_->GetRequestStatus(*id, 1).error.code(), StatusCode::kNotFound);
  EXPECT_EQ(init_->GetBatchStatus(*id).state, TransferState::kCompleted);
  EXPECT_TRUE(init_->FreeBatch(*id).ok());
  EXPECT_EQ(init_->FreeBatch(*id).code(), StatusCode::kNotFound);
  EXPECT_EQ(init_->GetBatchStatus(*id).first_error.code(), StatusCode::kNotFound);
  EXPECT_EQ(init_->WaitBatch(*id).state, TransferState::kFailed);
  EXPECT_EQ(remote_mem_[0], 0xab);
  const TransferCounters c = init_->Counters();
  EXPECT_EQ(c.requests_completed, 1u);
  EXPECT_EQ(c.bytes_written, 4096u);
  EXPECT_EQ(c.requests_failed + c.requests_timed_out, 0u);
}

}  // namespace
}  // namespace tandem::transfer
