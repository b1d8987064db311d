// Data movement between two engines in this process (embedded metadata), over shared memory and
// over TCP loopback: writes and reads of random data, verified byte for byte; notifications.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "transfer/transfer_engine.h"
#include "transfer/transfer_test_util.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;
using testing::FillRandom;

constexpr uint64_t kSegBytes = 48ull << 20;

class DataPath : public ::testing::TestWithParam<Protocol> {
 protected:
  void SetUp() override {
    meta_ = testing::FreshEmbeddedStore();
    target_ = testing::MakeEngine("data-t", meta_);
    init_ = testing::MakeEngine("data-i", meta_, {GetParam()});
    ASSERT_TRUE(target_ && init_);
    auto seg = target_->AllocateSegment("data-t/kv", kSegBytes);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    remote_ = static_cast<uint8_t*>(*seg);
    local_.resize(kSegBytes);
    ASSERT_TRUE(init_->RegisterLocalMemory(local_.data(), local_.size()).ok());
    auto h = init_->OpenSegment("data-t/kv");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    seg_ = *h;
    ASSERT_EQ(*init_->SegmentProtocol(seg_), GetParam());
  }

  BatchStatus Run(const std::vector<TransferRequest>& reqs, const std::string& note = {}) {
    auto id = init_->SubmitBatch(reqs, Clock::now() + 10s, note);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return {};
    BatchStatus s = init_->WaitBatch(*id);
    EXPECT_TRUE(init_->FreeBatch(*id).ok());
    return s;
  }

  std::shared_ptr<MetadataStore> meta_;
  std::unique_ptr<TransferEngine> target_, init_;
  uint8_t* remote_ = nullptr;
  std::vector<uint8_t> local_;
  SegmentHandle seg_;
};

TEST_P(DataPath, WriteThenReadVariousSizes) {
  struct Case {
    uint64_t length, local_off, remote_off;
  };
  // Non-aligned offsets on both sides; 16 MiB spans several slices.
  const std::vector<Case> cases = {{1, 0, 0},           {1, 13, 4095},
                                   {4096, 0, 4096},     {4096, 7, 12289},
                                   {1 << 20, 3, 65537}, {16 << 20, 101, (20 << 20) + 5}};
  uint64_t expect_written = 0, expect_read = 0;
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("length " + std::to_string(c.length));
    FillRandom(local_.data() + c.local_off, c.length, 1000 + n);
    BatchStatus s =
        Run({{OpCode::kWrite, local_.data() + c.local_off, seg_, c.remote_off, c.length}});
    ASSERT_EQ(s.state, TransferState::kCompleted) << s.first_error.ToString();
    ASSERT_EQ(std::memcmp(remote_ + c.remote_off, local_.data() + c.local_off, c.length), 0);
    expect_written += c.length;

    // Read it back into a different, differently aligned place.
    const uint64_t back_off = (24 << 20) + 3 * c.local_off + 1;
    std::memset(local_.data() + back_off, 0, c.length);
    s = Run({{OpCode::kRead, local_.data() + back_off, seg_, c.remote_off, c.length}});
    ASSERT_EQ(s.state, TransferState::kCompleted) << s.first_error.ToString();
    ASSERT_EQ(std::memcmp(local_.data() + back_off, remote_ + c.remote_off, c.length), 0);
    expect_read += c.length;
    ++n;
  }
  const TransferCounters ci = init_->Counters();
  EXPECT_EQ(ci.bytes_written, expect_written);
  EXPECT_EQ(ci.bytes_read, expect_read);
  EXPECT_EQ(ci.requests_completed, 2 * cases.size());
  EXPECT_EQ(ci.requests_failed + ci.requests_timed_out + ci.requests_refused, 0u);
  // Only TCP involves the target's engine.
  EXPECT_EQ(target_->Counters().bytes_served,
            GetParam() == Protocol::kTcp ? expect_written + expect_read : 0u);
}

TEST_P(DataPath, ManyKvSizedWritesInOneBatch) {
  // 240 layer slices of 30 KiB, scattered over the segment, like a prefill pushing KV blocks.
  constexpr uint64_t kSlice = 30 << 10;
  constexpr int kCount = 240;
  FillRandom(local_.data(), kCount * kSlice, 42);
  std::vector<TransferRequest> reqs;
  for (int i = 0; i < kCount; ++i) {
    const uint64_t remote_off = static_cast<uint64_t>((i * 37) % kCount) * (kSlice + 64);
    reqs.push_back({OpCode::kWrite, local_.data() + i * kSlice, seg_, remote_off, kSlice});
  }
  BatchStatus s = Run(reqs);
  ASSERT_EQ(s.state, TransferState::kCompleted) << s.first_error.ToString();
  EXPECT_EQ(s.completed, kCount);
  for (const auto& r : reqs) {
    ASSERT_EQ(std::memcmp(remote_ + r.remote_offset, r.local, r.length), 0);
  }
}

TEST_P(DataPath, NotificationArrivesAfterTheData) {
  constexpr uint64_t kLen = 3 << 20;
  FillRandom(local_.data(), kLen, 9);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Notification> got;
  bool data_was_there = false;
  target_->SetNotificationHandler([&](const Notification& n) {
    // Runs on the receiver: the batch's data must already be in the segment.
    const bool ok = std::memcmp(remote_ + 4096, local_.data(), kLen) == 0;
    std::lock_guard<std::mutex> lock(mu);
    data_was_there = ok;
    got.push_back(n);
    cv.notify_all();
  });
  BatchStatus s = Run({{OpCode::kWrite, local_.data(), seg_, 4096, kLen / 2},
                       {OpCode::kWrite, local_.data() + kLen / 2, seg_, 4096 + kLen / 2, kLen / 2}},
                      "kv-done:req-7");
  ASSERT_EQ(s.state, TransferState::kCompleted) << s.first_error.ToString();
  {
    std::unique_lock<std::mutex> lock(mu);
    // The sender's batch completes only once the receiver acknowledged, so no waiting here.
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(data_was_there);
    EXPECT_EQ(got[0].from, "data-i");
    EXPECT_EQ(got[0].segment, "data-t/kv");
    EXPECT_EQ(got[0].message, "kv-done:req-7");
  }
  EXPECT_EQ(init_->Counters().notifications_sent, 1u);
  EXPECT_EQ(target_->Counters().notifications_received, 1u);
}

TEST_P(DataPath, NoNotificationWhenARequestFails) {
  std::atomic<int> notes{0};
  target_->SetNotificationHandler([&](const Notification&) { notes.fetch_add(1); });
  // A deadline already in the past: every request times out, nothing is announced.
  TransferRequest r{OpCode::kWrite, local_.data(), seg_, 0, 4096};
  auto id = init_->SubmitBatch({&r, 1}, Clock::now() - 1ms, "must-not-arrive");
  ASSERT_TRUE(id.ok());
  BatchStatus s = init_->WaitBatch(*id);
  EXPECT_EQ(s.state, TransferState::kTimedOut);
  EXPECT_EQ(s.first_error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(init_->GetRequestStatus(*id, 0).state, TransferState::kTimedOut);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(notes.load(), 0);
  EXPECT_EQ(init_->Counters().requests_timed_out, 1u);
  EXPECT_EQ(init_->Counters().notifications_sent, 0u);
}

TEST_P(DataPath, ConcurrentBatchesFromSeveralThreads) {
  constexpr int kThreads = 4, kBatches = 10, kPerBatch = 8;
  constexpr uint64_t kLen = 64 << 10;
  FillRandom(local_.data(), kThreads * kPerBatch * kLen, 5);
  std::vector<std::thread> threads;
  std::atomic<int> completed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kBatches; ++b) {
        std::vector<TransferRequest> reqs;
        for (int i = 0; i < kPerBatch; ++i) {
          const uint64_t off = static_cast<uint64_t>(t * kPerBatch + i) * kLen;
          reqs.push_back({OpCode::kWrite, local_.data() + off, seg_, off, kLen});
        }
        auto id = init_->SubmitBatch(reqs, Clock::now() + 10s);
        if (!id.ok()) continue;
        if (init_->WaitBatch(*id).state == TransferState::kCompleted) completed.fetch_add(1);
        EXPECT_TRUE(init_->FreeBatch(*id).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(completed.load(), kThreads * kBatches);
  EXPECT_EQ(std::memcmp(remote_, local_.data(), kThreads * kPerBatch * kLen), 0);
}

// Informative only: loopback throughput of 1 MiB and 30 KiB writes (printed, not asserted).
TEST_P(DataPath, ThroughputReport) {
  for (uint64_t len : {uint64_t{1} << 20, uint64_t{30} << 10}) {
    const int count = static_cast<int>((32ull << 20) / len);
    std::vector<TransferRequest> reqs;
    for (int i = 0; i < count; ++i) {
      reqs.push_back({OpCode::kWrite, local_.data() + i * len, seg_, i * len, len});
    }
    Run(reqs);  // warm-up (page faults on both sides)
    const auto t0 = Clock::now();
    constexpr int kRounds = 4;
    for (int round = 0; round < kRounds; ++round) {
      ASSERT_EQ(Run(reqs).state, TransferState::kCompleted);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double mbps = kRounds * count * static_cast<double>(len) / s / 1e6;
    std::printf("[ throughput ] %s writes of %llu KiB: %.0f MB/s (batches of %d)\n",
                ProtocolName(GetParam()), static_cast<unsigned long long>(len >> 10), mbps, count);
  }
}

// Resident kB of each mapping of this process whose name contains `name`, in address order
// (/proc/self/smaps: a mapping's header line, then its "Rss:" line among others).
std::vector<int64_t> MappingRssKb(const std::string& name) {
  std::vector<int64_t> out;
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    const bool header = !line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
                        line.find('-') != std::string::npos && line.find(':') > line.find(' ');
    if (header) {
      inside = line.find(name) != std::string::npos;
      continue;
    }
    long long kb = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %lld kB", &kb) == 1) out.push_back(kb);
  }
  return out;
}

TEST(DataPathShm, CopiesDoNotStayInTheInitiatorsResidentSet) {
  // Two mappings of the target's memfd in this process: the target's own (every page resident
  // once zeroed) and the initiator's. After a 32 MiB write and a read back, the
  // initiator's mapping holds almost nothing resident, and the bytes are intact.
  auto meta = testing::FreshEmbeddedStore();
  auto target = testing::MakeEngine("rss-t", meta);
  auto init = testing::MakeEngine("rss-i", meta, {Protocol::kShm});
  ASSERT_TRUE(target && init);
  constexpr uint64_t kBytes = 32ull << 20;
  auto seg = target->AllocateSegment("rss-t/kv", kBytes);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  std::memset(*seg, 0, kBytes);  // as a KV cache is: every page of the owner's mapping resident
  std::vector<uint8_t> local(kBytes), back(kBytes);
  FillRandom(local.data(), kBytes, 5);
  ASSERT_TRUE(init->RegisterLocalMemory(local.data(), kBytes).ok());
  ASSERT_TRUE(init->RegisterLocalMemory(back.data(), kBytes).ok());
  auto h = init->OpenSegment("rss-t/kv");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  for (OpCode op : {OpCode::kWrite, OpCode::kRead}) {
    std::vector<TransferRequest> reqs = {
        {op, op == OpCode::kWrite ? local.data() : back.data(), *h, 0, kBytes}};
    auto id = init->SubmitBatch(reqs, Clock::now() + 10s);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_EQ(init->WaitBatch(*id).state, TransferState::kCompleted);
    ASSERT_TRUE(init->FreeBatch(*id).ok());
  }
  EXPECT_EQ(std::memcmp(local.data(), back.data(), kBytes), 0);
  const std::vector<int64_t> rss = MappingRssKb("tandem:rss-t/kv");
  ASSERT_EQ(rss.size(), 2u) << "the target's mapping and the initiator's";
  const int64_t most = std::max(rss[0], rss[1]), least = std::min(rss[0], rss[1]);
  EXPECT_GE(most, int64_t{kBytes >> 10} * 9 / 10) << "the owner's mapping";
  EXPECT_LT(least, 1024) << "the initiator's mapping kept " << least << " kB resident";
}

INSTANTIATE_TEST_SUITE_P(Transports, DataPath, ::testing::Values(Protocol::kShm, Protocol::kTcp),
                         [](const auto& info) { return std::string(ProtocolName(info.param)); });

TEST(DataPathTcp, CallerOwnedSegmentAndLoopbackToOwnSegment) {
  auto meta = testing::FreshEmbeddedStore();
  auto a = testing::MakeEngine("own-a", meta);
  ASSERT_NE(a, nullptr);
  std::vector<uint8_t> plain(1 << 20);
  ASSERT_TRUE(a->RegisterSegment("own-a/plain", plain.data(), plain.size()).ok());
  auto seg = a->AllocateSegment("own-a/shm", 1 << 20);
  ASSERT_TRUE(seg.ok());
  auto* shm = static_cast<uint8_t*>(*seg);
  // The engine opens its own segments: plain memory over TCP, the memfd one over shm.
  auto hp = a->OpenSegment("own-a/plain");
  auto hs = a->OpenSegment("own-a/shm");
  ASSERT_TRUE(hp.ok() && hs.ok());
  EXPECT_EQ(*a->SegmentProtocol(*hp), Protocol::kTcp);
  EXPECT_EQ(*a->SegmentProtocol(*hs), Protocol::kShm);
  FillRandom(shm, 300000, 3);
  std::vector<TransferRequest> reqs = {{OpCode::kWrite, shm, *hp, 11, 300000}};
  auto id = a->SubmitBatch(reqs, Clock::now() + 5s);
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(a->WaitBatch(*id).state, TransferState::kCompleted);
  EXPECT_EQ(std::memcmp(plain.data() + 11, shm, 300000), 0);
  // And back through shm: read own shm segment into the plain one.
  reqs = {{OpCode::kRead, plain.data() + 500000, *hs, 0, 300000}};
  id = a->SubmitBatch(reqs, Clock::now() + 5s);
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(a->WaitBatch(*id).state, TransferState::kCompleted);
  EXPECT_EQ(std::memcmp(plain.data() + 500000, shm, 300000), 0);
  EXPECT_TRUE(a->CloseSegment(*hp).ok());
  EXPECT_TRUE(a->CloseSegment(*hs).ok());
  EXPECT_TRUE(a->UnregisterSegment("own-a/plain").ok());
}

}  // namespace
}  // namespace tandem::transfer
