// The pool end to end in one process and a peer process: a real master over HTTP, real
// transfer engines moving the bytes (shared memory), a storage node killed with SIGKILL.
#include "store/pool.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "transfer/transfer_test_util.h"

namespace tandem::store {
namespace {

using std::chrono::milliseconds;
using transfer::testing::FillRandom;

constexpr uint64_t kObject = 4096;  // bytes per object in these tests

std::vector<std::string> Keys(const std::string& ns, int begin, int end) {
  std::vector<std::string> k;
  for (int i = begin; i < end; ++i) k.push_back(ObjectKey(ns, 1000 + i));
  return k;
}

// Registered local memory of n objects, filled with seed-dependent bytes.
struct Buffer {
  Buffer(transfer::TransferEngine* te, int n, uint64_t seed) : te(te), bytes(n * kObject) {
    FillRandom(bytes.data(), bytes.size(), seed);
    EXPECT_TRUE(te->RegisterLocalMemory(bytes.data(), bytes.size()).ok());
  }
  ~Buffer() { (void)te->UnregisterLocalMemory(bytes.data()); }
  std::vector<void*> Ptrs(int begin, int end) {
    std::vector<void*> p;
    for (int i = begin; i < end; ++i) p.push_back(bytes.data() + i * kObject);
    return p;
  }
  transfer::TransferEngine* te;
  std::vector<uint8_t> bytes;
};

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = transfer::testing::FreshEmbeddedStore();
    PoolMasterOptions mo;
    mo.expire_interval = milliseconds(20);
    auto master = PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_);
    ASSERT_TRUE(master.ok()) << master.status().ToString();
    master_ = std::move(*master);
    te_a_ = transfer::testing::MakeEngine("a", metadata_);
    te_b_ = transfer::testing::MakeEngine("b", metadata_);
    ASSERT_TRUE(te_a_ && te_b_);
  }

  std::unique_ptr<PoolClient> Client(transfer::TransferEngine* te, const std::string& node) {
    PoolClientOptions o;
    o.metadata = metadata_;  // finds the master there
    o.engine = te;
    o.node = node;
    o.segment_ttl = milliseconds(600);
    auto c = PoolClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  Clock::time_point Deadline() const { return Clock::now() + std::chrono::seconds(5); }

  std::shared_ptr<transfer::MetadataStore> metadata_;
  std::unique_ptr<PoolMasterServer> master_;
  std::unique_ptr<transfer::TransferEngine> te_a_, te_b_;
};

TEST_F(PoolTest, WhatOneClientPutsAnotherReads) {
  auto a = Client(te_a_.get(), "host-a");
  auto b = Client(te_b_.get(), "host-b");
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  const auto keys = Keys("ns", 0, 4);
  Buffer src(te_b_.get(), 4, 7);
  auto put = b->Put(keys, src.Ptrs(0, 4), kObject, Deadline());
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(*put, 4);
  // Stored once: a second put of the same keys writes nothing.
  EXPECT_EQ(*b->Put(keys, src.Ptrs(0, 4), kObject, Deadline()), 0);
  EXPECT_EQ(b->Stats().put_existing, 4u);

  Buffer dst(te_a_.get(), 4, 99);
  auto got = a->GetPrefix(keys, dst.Ptrs(0, 4), kObject, Deadline());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 4);
  EXPECT_EQ(std::memcmp(dst.bytes.data(), src.bytes.data(), 4 * kObject), 0);
  EXPECT_EQ(a->Stats().bytes_fetched, 4 * kObject);

  // The prefix stops at the first key the pool lacks.
  auto mixed = keys;
  mixed[2] = ObjectKey("ns", 1);
  EXPECT_EQ(*a->GetPrefix(mixed, dst.Ptrs(0, 4), kObject, Deadline()), 2);
  // Another namespace sees nothing.
  EXPECT_EQ(*a->GetPrefix(Keys("other", 0, 4), dst.Ptrs(0, 4), kObject, Deadline()), 0);
  // Exist and Remove.
  EXPECT_EQ(*a->Exist(keys, Deadline()), (std::vector<bool>{true, true, true, true}));
  ASSERT_TRUE(a->Remove({keys[3]}, Deadline()).ok());
  EXPECT_EQ(*a->Exist(keys, Deadline()), (std::vector<bool>{true, true, true, false}));
  const auto usage = master_->Usage();
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].objects, 4);  // the removed one is leased to the reader above for now
}

// An object of another size under the same key is never read into a buffer of this size.
TEST_F(PoolTest, AnObjectOfAnotherSizeIsAMissNotWrongBytes) {
  auto a = Client(te_a_.get(), "host-a");
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  Buffer src(te_a_.get(), 2, 3);
  ASSERT_EQ(*a->Put(Keys("ns", 0, 1), src.Ptrs(0, 1), kObject / 2, Deadline()), 1);
  Buffer dst(te_a_.get(), 1, 5);
  const std::vector<uint8_t> before = dst.bytes;
  EXPECT_EQ(*a->GetPrefix(Keys("ns", 0, 1), dst.Ptrs(0, 1), kObject, Deadline()), 0);
  EXPECT_EQ(dst.bytes, before);
}

TEST_F(PoolTest, APoolWithoutSpaceStoresWhatFitsAndSaysSo) {
  auto a = Client(te_a_.get(), "host-a");
  ASSERT_TRUE(a->MountDram("a/pool", 2 * kObject).ok());
  // Two objects fill it. Objects being written are never evicted, so a third in the same call
  // finds no space; once those are committed (and not leased) a later put evicts them.
  Buffer src(te_a_.get(), 5, 11);
  EXPECT_EQ(*a->Put(Keys("ns", 0, 3), src.Ptrs(0, 3), kObject, Deadline()), 2);
  EXPECT_EQ(a->Stats().put_no_space, 1u);
  EXPECT_EQ(*a->Put(Keys("ns", 3, 5), src.Ptrs(3, 5), kObject, Deadline()), 2);
  EXPECT_EQ(master_->Counters().evictions, 2u);
  EXPECT_EQ(*a->Exist(Keys("ns", 0, 5), Deadline()),
            (std::vector<bool>{false, false, false, true, true}));
  // An object larger than the whole pool finds no space.
  std::vector<uint8_t> big(4 * kObject);
  ASSERT_TRUE(te_a_->RegisterLocalMemory(big.data(), big.size()).ok());
  EXPECT_EQ(*a->Put(Keys("ns", 9, 10), {big.data()}, big.size(), Deadline()), 0);
  EXPECT_EQ(a->Stats().put_no_space, 2u);
  ASSERT_TRUE(te_a_->UnregisterLocalMemory(big.data()).ok());
}

TEST_F(PoolTest, NoMasterIsUnavailableWithinTheDeadline) {
  PoolClientOptions o;
  o.master_uri = "http://127.0.0.1:1";  // nothing listens there
  o.engine = te_a_.get();
  o.rpc_timeout = milliseconds(300);
  auto c = PoolClient::Create(o);
  ASSERT_TRUE(c.ok());
  Buffer dst(te_a_.get(), 1, 1);
  const auto start = Clock::now();
  auto got = (*c)->GetPrefix(Keys("ns", 0, 1), dst.Ptrs(0, 1), kObject, Deadline());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_GE((*c)->Stats().master_unavailable, 1u);
}

// A master that goes away: calls fail fast (Unavailable, counted); a new master published in
// the metadata service is found, the segments are mounted again by their heartbeat, and the
// pool works again.
TEST_F(PoolTest, ARestartedMasterIsFoundAndSegmentsRemount) {
  PoolClientOptions o;
  o.metadata = metadata_;
  o.engine = te_a_.get();
  o.node = "host-a";
  o.segment_ttl = milliseconds(300);
  o.master_retry = milliseconds(100);
  auto a = std::move(*PoolClient::Create(o));
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  Buffer src(te_a_.get(), 2, 5), dst(te_a_.get(), 2, 6);
  ASSERT_EQ(*a->Put(Keys("ns", 0, 1), src.Ptrs(0, 1), kObject, Deadline()), 1);

  master_.reset();
  auto put = a->Put(Keys("ns", 1, 2), src.Ptrs(1, 2), kObject, Deadline());
  EXPECT_EQ(put.status().code(), StatusCode::kUnavailable) << put.status().ToString();
  EXPECT_GE(a->Stats().master_unavailable, 1u);

  PoolMasterOptions mo;
  mo.expire_interval = milliseconds(20);
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  ASSERT_TRUE(transfer::testing::WaitFor([&] { return master_->Usage().size() == 1; },
                                         std::chrono::seconds(5)));
  // The new master knows nothing of the old objects (a cache: they are recomputed), and takes
  // new ones.
  EXPECT_EQ(*a->GetPrefix(Keys("ns", 0, 1), dst.Ptrs(0, 1), kObject, Deadline()), 0);
  ASSERT_EQ(*a->Put(Keys("ns", 1, 2), src.Ptrs(1, 2), kObject, Deadline()), 1);
  EXPECT_EQ(*a->GetPrefix(Keys("ns", 1, 2), dst.Ptrs(1, 2), kObject, Deadline()), 1);
  EXPECT_EQ(std::memcmp(dst.bytes.data() + kObject, src.bytes.data() + kObject, kObject), 0);
}

TEST_F(PoolTest, TheMasterRefusesBadRequests) {
  httplib::Client http("127.0.0.1", master_->port());
  auto res = http.Post("/pool/put_start", "not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  res = http.Post("/pool/put_start", R"({"keys": ["k"], "size": 10})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);  // replicas, node, ttl_ms missing
  res = http.Post("/pool/get", R"({"keys": "k", "lease_ms": 10})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  res = http.Post("/pool/mount", R"({"segment": "s", "node": "n", "capacity": 0, "ttl_ms": 10})",
                  "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_TRUE(master_->Usage().empty());
}

// A master with a journal, killed (destroyed without warning to its clients) and started again:
// it restores every object from the metadata service, and readers find them without a new put.
TEST_F(PoolTest, AMasterWithAJournalRestoresItsObjectsAfterARestart) {
  master_.reset();
  PoolMasterOptions mo;
  mo.expire_interval = milliseconds(20);
  mo.journal = true;
  mo.journal_interval = milliseconds(10);
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  PoolClientOptions o;
  o.metadata = metadata_;
  o.engine = te_a_.get();
  o.node = "host-a";
  o.segment_ttl = milliseconds(600);
  o.master_retry = milliseconds(50);
  auto a = std::move(*PoolClient::Create(o));
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  auto b = Client(te_b_.get(), "host-b");
  const auto keys = Keys("ns", 0, 4);
  Buffer src(te_b_.get(), 4, 31), dst(te_a_.get(), 4, 32);
  ASSERT_EQ(*b->Put(keys, src.Ptrs(0, 4), kObject, Deadline()), 4);
  ASSERT_TRUE(transfer::testing::WaitFor(
      [&] { return metadata_->List(std::string(kJournalPrefix) + "objects/")->size() == 4; },
      std::chrono::seconds(5)));

  master_.reset();
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  EXPECT_EQ(master_->Counters().restored, 4u);
  ASSERT_TRUE(transfer::testing::WaitFor(
      [&] {
        auto n = a->GetPrefix(keys, dst.Ptrs(0, 4), kObject, Deadline());
        return n.ok() && *n == 4;
      },
      std::chrono::seconds(5)));
  EXPECT_EQ(dst.bytes, src.bytes);
  // The heartbeat renewed the restored segment: the objects outlive the restore grace.
  EXPECT_EQ(master_->Usage().size(), 1u);
  EXPECT_EQ(b->Stats().put_objects, 4u);  // nothing was written again
}

// A record whose bytes are not what its checksum says (a stale journal record, a segment whose
// owner restarted and holds fresh memory): the read is a miss, counted, and the replica dropped.
TEST_F(PoolTest, BytesThatDoNotMatchTheirChecksumAreAMiss) {
  master_.reset();
  PoolMasterOptions mo;
  mo.journal = true;
  mo.journal_interval = milliseconds(10);
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  auto a = Client(te_a_.get(), "host-a");
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  const auto keys = Keys("ns", 0, 2);
  Buffer src(te_a_.get(), 2, 41), dst(te_a_.get(), 2, 42);
  ASSERT_EQ(*a->Put(keys, src.Ptrs(0, 2), kObject, Deadline()), 2);
  const std::string record = std::string(kJournalPrefix) + "objects/" + keys[1];
  ASSERT_TRUE(transfer::testing::WaitFor([&] { return metadata_->Get(record).ok(); },
                                         std::chrono::seconds(5)));
  // The second object's record, as a restarted master will read it, claims other bytes.
  auto j = nlohmann::json::parse(*metadata_->Get(record));
  j["checksum"] = j["checksum"].get<uint64_t>() ^ 1;
  master_.reset();
  ASSERT_TRUE(metadata_->PutDurable(record, j.dump()).ok());
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  auto reader = Client(te_a_.get(), "host-a");
  EXPECT_EQ(*reader->GetPrefix(keys, dst.Ptrs(0, 2), kObject, Deadline()), 1);
  EXPECT_EQ(reader->Stats().checksum_failures, 1u);
  EXPECT_EQ(*reader->Exist(keys, Deadline()), (std::vector<bool>{true, false}));
}

// A hot object: after `hot_gets` reads the master asks a reader to copy it to another node.
TEST_F(PoolTest, AHotObjectIsCopiedToAnotherNodeByItsReader) {
  master_.reset();
  PoolMasterOptions mo;
  mo.policy.hot_gets = 2;
  mo.policy.max_replicas = 2;
  master_ = std::move(*PoolMasterServer::Start("127.0.0.1", 0, mo, metadata_));
  auto a = Client(te_a_.get(), "host-a");
  auto b = Client(te_b_.get(), "host-b");
  ASSERT_TRUE(a->MountDram("a/pool", 64 * kObject).ok());
  ASSERT_TRUE(b->MountDram("b/pool", 64 * kObject).ok());
  const auto keys = Keys("ns", 0, 2);
  Buffer src(te_b_.get(), 2, 51), dst(te_a_.get(), 2, 52);
  ASSERT_EQ(*b->Put(keys, src.Ptrs(0, 2), kObject, Deadline()), 2);  // on host-b: the writer's
  ASSERT_EQ(*a->GetPrefix(keys, dst.Ptrs(0, 2), kObject, Deadline()), 2);
  EXPECT_EQ(a->Stats().hot_copies, 0u);
  ASSERT_EQ(*a->GetPrefix(keys, dst.Ptrs(0, 2), kObject, Deadline()), 2);
  EXPECT_EQ(a->Stats().hot_copies, 2u);
  EXPECT_EQ(master_->Counters().hot_replicas, 2u);
  int on_a = 0;
  for (const SegmentUsage& u : master_->Usage()) on_a += u.name == "a/pool" ? u.objects : 0;
  EXPECT_EQ(on_a, 2);
  // Host b's segment gone: the copies on host a serve.
  b.reset();
  std::fill(dst.bytes.begin(), dst.bytes.end(), 0);
  ASSERT_EQ(*a->GetPrefix(keys, dst.Ptrs(0, 2), kObject, Deadline()), 2);
  EXPECT_EQ(dst.bytes, src.bytes);
}

TEST_F(PoolTest, TheSsdTierKeepsWhatTheDramPoolLostAndServesWithoutAMaster) {
  const std::string dir = ::testing::TempDir() + "/tandem-pool-ssd-" + std::to_string(::getpid());
  PoolClientOptions o;
  o.metadata = metadata_;
  o.engine = te_a_.get();
  o.node = "host-a";
  o.master_retry = milliseconds(50);
  o.ssd_dir = dir;
  o.ssd_bytes = 64 * kObject;
  auto a = std::move(*PoolClient::Create(o));
  ASSERT_TRUE(a->MountDram("a/pool", 2 * kObject).ok());  // DRAM for two objects
  const auto keys = Keys("ns", 0, 4);
  Buffer src(te_a_.get(), 4, 61), dst(te_a_.get(), 4, 62);
  ASSERT_EQ(*a->Put(Keys("ns", 0, 2), src.Ptrs(0, 2), kObject, Deadline()), 2);
  ASSERT_EQ(*a->Put(Keys("ns", 2, 4), src.Ptrs(2, 4), kObject, Deadline()), 2);  // evicts 0, 1
  ASSERT_TRUE(transfer::testing::WaitFor([&] { return a->Stats().ssd_written_objects == 4; },
                                         std::chrono::seconds(5)));
  // Held, as far as this client can read: 0 and 1 on its SSD tier only.
  EXPECT_EQ(*a->Exist(keys, Deadline()), (std::vector<bool>{true, true, true, true}));
  // The evicted head is a DRAM miss; the SSD tier gives the whole prefix, and the head is
  // promoted back into DRAM (evicting the rest, which the SSD tier still holds).
  ASSERT_EQ(*a->GetPrefix(keys, dst.Ptrs(0, 4), kObject, Deadline()), 4);
  EXPECT_EQ(dst.bytes, src.bytes);
  EXPECT_EQ(a->Stats().ssd_hit_objects, 4u);
  // Now the head from DRAM, the rest from the SSD tier.
  std::fill(dst.bytes.begin(), dst.bytes.end(), 0);
  ASSERT_EQ(*a->GetPrefix(keys, dst.Ptrs(0, 4), kObject, Deadline()), 4);
  EXPECT_EQ(dst.bytes, src.bytes);
  EXPECT_EQ(a->Stats().ssd_hit_objects, 6u);
  // No master at all: the SSD tier still answers.
  master_.reset();
  std::fill(dst.bytes.begin(), dst.bytes.end(), 0);
  auto got = a->GetPrefix(keys, dst.Ptrs(0, 4), kObject, Deadline());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 4);
  EXPECT_EQ(dst.bytes, src.bytes);
  EXPECT_EQ(*a->Exist(keys, Deadline()), (std::vector<bool>{true, true, true, true}));
  a.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(PoolTest, AnUnwritableSsdDirectoryIsAClearError) {
  PoolClientOptions o;
  o.metadata = metadata_;
  o.engine = te_a_.get();
  o.ssd_dir = "/proc/tandem-cannot-be-here";
  o.ssd_bytes = 1 << 20;
  auto c = PoolClient::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/proc/tandem-cannot-be-here"), std::string::npos)
      << c.status().ToString();
}

// A storage node killed with SIGKILL: reads of its objects fail within the deadline (counted,
// the prefix stops there), and its objects leave the master once its lease lapses. Over TCP, so
// that a dead owner means failed reads (a shared-memory mapping would outlive it).
TEST(PoolNodeFailureTest, AKilledStorageNodeIsAMissThenForgotten) {
  auto server = transfer::MetadataHttpServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const std::string uri = "http://127.0.0.1:" + std::to_string((*server)->port());
  auto metadata = transfer::OpenMetadataStore(uri);
  ASSERT_TRUE(metadata.ok());
  PoolMasterOptions mo;
  mo.expire_interval = milliseconds(20);
  auto master = PoolMasterServer::Start("127.0.0.1", 0, mo, *metadata);
  ASSERT_TRUE(master.ok());
  auto peer = transfer::testing::PeerProcess::Start(uri, "peer", "peer/pool", 64 * kObject);
  ASSERT_TRUE(peer != nullptr);
  auto te = transfer::testing::MakeEngine("reader", *metadata, {transfer::Protocol::kTcp});
  ASSERT_TRUE(te != nullptr);
  ASSERT_TRUE(transfer::testing::WaitFor([&] { return te->OpenSegment("peer/pool").ok(); },
                                         std::chrono::seconds(10)));
  // The node's mount, as its own client would do it, with a 1 s lease nobody renews.
  httplib::Client http("127.0.0.1", (*master)->port());
  const nlohmann::json mount = {
      {"segment", "peer/pool"}, {"node", "peer"}, {"capacity", 64 * kObject}, {"ttl_ms", 1000}};
  auto res = http.Post("/pool/mount", mount.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200);

  PoolClientOptions o;
  o.metadata = *metadata;
  o.engine = te.get();
  o.node = "reader";
  auto client = PoolClient::Create(o);
  ASSERT_TRUE(client.ok());
  const auto keys = Keys("ns", 0, 3);
  Buffer src(te.get(), 3, 21), dst(te.get(), 3, 22);
  ASSERT_EQ(*(*client)->Put(keys, src.Ptrs(0, 3), kObject, Clock::now() + std::chrono::seconds(5)),
            3);
  ASSERT_EQ(
      *(*client)->GetPrefix(keys, dst.Ptrs(0, 3), kObject, Clock::now() + std::chrono::seconds(5)),
      3);
  EXPECT_EQ(dst.bytes, src.bytes);

  peer->Signal(SIGKILL);
  const auto start = Clock::now();
  auto got =
      (*client)->GetPrefix(keys, dst.Ptrs(0, 3), kObject, Clock::now() + std::chrono::seconds(2));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // Every read failed: the bad replicas were reported, and with them the objects are gone.
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 0);
  EXPECT_GE((*client)->Stats().fetch_failures, 1u);
  EXPECT_EQ(*(*client)->Exist(keys, Clock::now() + std::chrono::seconds(2)),
            (std::vector<bool>{false, false, false}));
  // The segment itself goes when its lease lapses.
  EXPECT_TRUE(transfer::testing::WaitFor([&] { return (*master)->Usage().empty(); },
                                         std::chrono::seconds(5)));
}

}  // namespace
}  // namespace tandem::store
