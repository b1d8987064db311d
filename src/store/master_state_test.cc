// The pool master's policy, called directly with an explicit clock.
#include "store/master_state.h"

#include <gtest/gtest.h>

namespace tandem::store {
namespace {

using std::chrono::seconds;

const Clock::time_point t0{};  // the tests' epoch

std::vector<std::string> Keys(int begin, int end) {
  std::vector<std::string> k;
  for (int i = begin; i < end; ++i) k.push_back("ns/" + std::to_string(i));
  return k;
}

// Puts and commits `keys` (objects of `size` bytes, one replica each) at `now`.
void PutAll(MasterState& m, const std::vector<std::string>& keys, uint64_t size,
            Clock::time_point now, const std::string& writer = "n0") {
  const auto r = m.PutStart(keys, size, 1, writer, now, now + seconds(5));
  for (const auto& x : r) ASSERT_EQ(x.decision, PutDecision::kReserved);
  m.PutEnd(keys, std::vector<bool>(keys.size(), true), std::vector<uint64_t>(keys.size(), 42));
}

TEST(MasterStateTest, AnObjectIsVisibleOnlyAfterItsPutIsCommitted) {
  MasterState m;
  ASSERT_TRUE(m.Mount("s0", "n0", 1000, t0 + seconds(60)).ok());
  const auto r = m.PutStart(Keys(0, 1), 100, 1, "n0", t0, t0 + seconds(5));
  ASSERT_EQ(r[0].decision, PutDecision::kReserved);
  ASSERT_EQ(r[0].locations.size(), 1u);
  EXPECT_EQ(r[0].locations[0].segment, "s0");
  EXPECT_EQ(r[0].locations[0].size, 100u);
  EXPECT_EQ(m.used(), 100u);  // reserved space counts
  EXPECT_TRUE(m.GetPrefix(Keys(0, 1), t0, t0).empty());
  EXPECT_FALSE(m.Exist(Keys(0, 1))[0]);
  // A second writer of the same key is told it exists (being written).
  EXPECT_EQ(m.PutStart(Keys(0, 1), 100, 1, "n0", t0, t0 + seconds(5))[0].decision,
            PutDecision::kExists);
  m.PutEnd(Keys(0, 1), {true}, {42});
  EXPECT_TRUE(m.Exist(Keys(0, 1))[0]);
  const auto got = m.GetPrefix(Keys(0, 1), t0, t0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].replicas[0].offset, r[0].locations[0].offset);
  EXPECT_EQ(got[0].checksum, 42u);  // as the writer reported it
  EXPECT_EQ(m.counters().puts_committed, 1u);
}

TEST(MasterStateTest, AWriterThatDiesLeavesNothingVisible) {
  MasterState m;
  ASSERT_TRUE(m.Mount("s0", "n0", 1000, t0 + seconds(60)).ok());
  ASSERT_EQ(m.PutStart(Keys(0, 2), 100, 1, "n0", t0, t0 + seconds(5))[0].decision,
            PutDecision::kReserved);
  m.PutEnd(Keys(1, 2), {false}, {42});  // aborted at once
  EXPECT_EQ(m.used(), 100u);
  m.Expire(t0 + seconds(4));  // still within its deadline
  EXPECT_EQ(m.used(), 100u);
  m.Expire(t0 + seconds(5));
  EXPECT_EQ(m.used(), 0u);
  m.PutEnd(Keys(0, 1), {true}, {42});  // too late: ignored
  EXPECT_FALSE(m.Exist(Keys(0, 1))[0]);
  EXPECT_EQ(m.counters().puts_expired, 1u);
  EXPECT_EQ(m.counters().puts_aborted, 1u);
}

TEST(MasterStateTest, GetReturnsTheLongestVisiblePrefix) {
  MasterState m;
  ASSERT_TRUE(m.Mount("s0", "n0", 10000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 3), 100, t0);
  PutAll(m, Keys(4, 6), 100, t0);  // key 3 missing: 4 and 5 are not part of the prefix
  EXPECT_EQ(m.GetPrefix(Keys(0, 6), t0, t0).size(), 3u);
  EXPECT_EQ(m.GetPrefix(Keys(4, 6), t0, t0).size(), 2u);
  EXPECT_TRUE(m.GetPrefix(Keys(3, 6), t0, t0).empty());
}

TEST(MasterStateTest, ReplicasGoToDistinctNodesWriterFirst) {
  MasterState m;
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("a1", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(60)).ok());
  const auto r = m.PutStart(Keys(0, 1), 100, 3, "b", t0, t0 + seconds(5));
  ASSERT_EQ(r[0].decision, PutDecision::kReserved);
  ASSERT_EQ(r[0].locations.size(), 2u);  // two nodes: two replicas at most
  EXPECT_EQ(r[0].locations[0].node, "b");
  EXPECT_EQ(r[0].locations[1].node, "a");
}

TEST(MasterStateTest, EvictsLeastRecentlyUsedDownToTheLowWatermark) {
  MasterOptions o;
  o.high_watermark = 0.9;
  o.low_watermark = 0.5;
  o.alignment = 1;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("s0", "n0", 1000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 9), 100, t0);  // 900 bytes: at the high watermark
  // Keys 0 and 1 used again: the least recently used are now 2, 3, ...
  ASSERT_EQ(m.GetPrefix(Keys(0, 2), t0, t0).size(), 2u);
  PutAll(m, Keys(9, 10), 100, t0);  // would reach 1000 > 900: evict to <= 500 with it
  EXPECT_EQ(m.used(), 500u);
  EXPECT_EQ(m.counters().evictions, 5u);
  const auto alive = m.Exist(Keys(0, 10));
  EXPECT_TRUE(alive[0]);
  EXPECT_TRUE(alive[1]);
  for (int k = 2; k <= 6; ++k) EXPECT_FALSE(alive[k]) << k;
  for (int k = 7; k <= 9; ++k) EXPECT_TRUE(alive[k]) << k;
}

TEST(MasterStateTest, LeasedAndUnfinishedObjectsAreNeverEvicted) {
  MasterOptions o;
  o.high_watermark = 1.0;
  o.low_watermark = 1.0;
  o.alignment = 1;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("s0", "n0", 300, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 2), 100, t0);
  ASSERT_EQ(m.GetPrefix(Keys(0, 2), t0, t0 + seconds(10)).size(), 2u);  // read leases
  ASSERT_EQ(m.PutStart(Keys(2, 3), 100, 1, "n0", t0, t0 + seconds(30))[0].decision,
            PutDecision::kReserved);  // full now; being written
  EXPECT_EQ(m.PutStart(Keys(3, 4), 100, 1, "n0", t0 + seconds(1), t0 + seconds(30))[0].decision,
            PutDecision::kNoSpace);
  EXPECT_EQ(m.counters().puts_no_space, 1u);
  // Once the leases end the least recently used leased object goes.
  EXPECT_EQ(m.PutStart(Keys(3, 4), 100, 1, "n0", t0 + seconds(10), t0 + seconds(30))[0].decision,
            PutDecision::kReserved);
  EXPECT_EQ(m.Exist(Keys(0, 2)), (std::vector<bool>{false, true}));
}

TEST(MasterStateTest, ASegmentWhoseLeaseLapsesTakesItsReplicasAlong) {
  MasterState m;
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(10)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(10)).ok());
  const auto r = m.PutStart(Keys(0, 1), 100, 2, "a", t0, t0 + seconds(5));
  ASSERT_EQ(r[0].locations.size(), 2u);
  m.PutEnd(Keys(0, 1), {true}, {42});
  PutAll(m, Keys(1, 2), 100, t0, "b");                           // one replica, on b
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(20)).ok());  // a renews, b does not
  m.Expire(t0 + seconds(10));
  EXPECT_EQ(m.Usage().size(), 1u);
  EXPECT_EQ(m.Exist(Keys(0, 2)), (std::vector<bool>{true, false}));
  EXPECT_EQ(m.GetPrefix(Keys(0, 1), t0 + seconds(10), t0)[0].replicas.size(), 1u);
  EXPECT_EQ(m.counters().replicas_lost, 2u);
  EXPECT_EQ(m.counters().objects_lost, 1u);
  EXPECT_EQ(m.used(), 100u);
  EXPECT_EQ(m.capacity(), 1000u);
}

TEST(MasterStateTest, ABadReplicaReportDropsOnlyThatReplica) {
  MasterState m;
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(60)).ok());
  ASSERT_EQ(m.PutStart(Keys(0, 1), 100, 2, "a", t0, t0 + seconds(5))[0].locations.size(), 2u);
  m.PutEnd(Keys(0, 1), {true}, {42});
  m.ReportBadReplica("ns/0", "a0");
  const auto got = m.GetPrefix(Keys(0, 1), t0, t0);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].replicas.size(), 1u);
  EXPECT_EQ(got[0].replicas[0].segment, "b0");
  m.ReportBadReplica("ns/0", "b0");
  EXPECT_FALSE(m.Exist(Keys(0, 1))[0]);
  EXPECT_EQ(m.used(), 0u);
}

TEST(MasterStateTest, RemoveWaitsForReaders) {
  MasterState m;
  ASSERT_TRUE(m.Mount("s0", "n0", 1000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 2), 100, t0);
  ASSERT_EQ(m.GetPrefix(Keys(0, 1), t0, t0 + seconds(3)).size(), 1u);
  EXPECT_EQ(m.Remove(Keys(0, 3), t0), 2);
  EXPECT_EQ(m.Exist(Keys(0, 2)), (std::vector<bool>{false, false}));  // invisible at once
  EXPECT_EQ(m.used(), 100u);  // the leased one's space is kept for its reader
  m.Expire(t0 + seconds(3));
  EXPECT_EQ(m.used(), 0u);
}

TEST(MasterStateTest, FreedSpaceCoalescesAndAlignmentHolds) {
  MasterOptions o;
  o.alignment = 64;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("s0", "n0", 640, t0 + seconds(60)).ok());
  const auto r = m.PutStart(Keys(0, 5), 100, 1, "n0", t0, t0 + seconds(5));
  for (const auto& x : r) {
    ASSERT_EQ(x.decision, PutDecision::kReserved);
    EXPECT_EQ(x.locations[0].offset % 64, 0u);
  }
  EXPECT_EQ(m.PutStart(Keys(5, 6), 100, 1, "n0", t0, t0 + seconds(5))[0].decision,
            PutDecision::kNoSpace);  // 5 x 128 (aligned) = 640
  m.PutEnd(Keys(0, 5), std::vector<bool>(5, false), std::vector<uint64_t>(5, 0));
  EXPECT_EQ(m.used(), 0u);
  // One object of the whole capacity fits again: the holes merged.
  EXPECT_EQ(m.PutStart(Keys(6, 7), 640, 1, "n0", t0, t0 + seconds(5))[0].decision,
            PutDecision::kReserved);
}

TEST(MasterStateTest, MountRefusesConflicts) {
  MasterState m;
  EXPECT_FALSE(m.Mount("s0", "n0", 0, t0).ok());
  ASSERT_TRUE(m.Mount("s0", "n0", 100, t0 + seconds(1)).ok());
  EXPECT_FALSE(m.Mount("s0", "n0", 200, t0 + seconds(1)).ok());
  EXPECT_FALSE(m.Mount("s0", "n1", 100, t0 + seconds(1)).ok());
  EXPECT_TRUE(m.Mount("s0", "n0", 100, t0 + seconds(2)).ok());
  m.Expire(t0 + seconds(1));
  EXPECT_EQ(m.Usage().size(), 1u);  // renewed
}

TEST(MasterStateTest, AHotObjectGetsOneMoreReplicaOnAnotherNodeCopiedByItsReader) {
  MasterOptions o;
  o.hot_gets = 3;
  o.max_replicas = 2;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 1), 100, t0, "a");
  EXPECT_EQ(m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0].replicate_to.size, 0u);
  EXPECT_EQ(m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0].replicate_to.size, 0u);
  // The third get asks its reader for a copy on the other node.
  const FoundObject third = m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0];
  ASSERT_EQ(third.replicate_to.size, 100u);
  EXPECT_EQ(third.replicate_to.node, "b");
  EXPECT_EQ(m.used(), 200u);  // reserved
  // Not visible as a replica before the reader reports it; no second copy is asked meanwhile.
  const FoundObject fourth = m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0];
  EXPECT_EQ(fourth.replicas.size(), 1u);
  EXPECT_EQ(fourth.replicate_to.size, 0u);
  m.ReplicaEnd(Keys(0, 1)[0], "b0", true);
  const FoundObject after = m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0];
  ASSERT_EQ(after.replicas.size(), 2u);
  EXPECT_EQ(after.replicas[1].segment, "b0");
  EXPECT_EQ(after.checksum, 42u);
  EXPECT_EQ(m.counters().hot_replicas, 1u);
  // At max_replicas: no more copies, however hot.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(m.GetPrefix(Keys(0, 1), t0, t0 + seconds(1))[0].replicate_to.size, 0u);
  }
}

TEST(MasterStateTest, AHotCopyNeverReportedIsFreedAtItsDeadline) {
  MasterOptions o;
  o.hot_gets = 1;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 1), 100, t0, "a");
  ASSERT_EQ(m.GetPrefix(Keys(0, 1), t0, t0 + seconds(2))[0].replicate_to.size, 100u);
  EXPECT_EQ(m.used(), 200u);
  m.Expire(t0 + seconds(1));
  EXPECT_EQ(m.used(), 200u);
  m.Expire(t0 + seconds(2));
  EXPECT_EQ(m.used(), 100u);
  m.ReplicaEnd(Keys(0, 1)[0], "b0", true);  // too late: ignored
  // Still one replica; this get asks for a copy again, which fails: its space is freed at once.
  const FoundObject again = m.GetPrefix(Keys(0, 1), t0 + seconds(3), t0 + seconds(5))[0];
  EXPECT_EQ(again.replicas.size(), 1u);
  ASSERT_EQ(again.replicate_to.size, 100u);
  EXPECT_EQ(m.used(), 200u);
  m.ReplicaEnd(Keys(0, 1)[0], "b0", false);
  EXPECT_EQ(m.used(), 100u);
}

// Copies the journal of `from` (its current records) as a restarted master would read it.
void Journal(MasterState& from, std::vector<SegmentRecord>* segments,
             std::vector<ObjectRecord>* objects) {
  const MasterChanges c = from.TakeChanges();
  for (const std::string& name : c.segments) {
    SegmentRecord r;
    if (from.SegmentRecordOf(name, &r)) segments->push_back(r);
  }
  for (const std::string& key : c.objects) {
    ObjectRecord r;
    if (from.ObjectRecordOf(key, &r)) objects->push_back(r);
  }
}

TEST(MasterStateTest, ARestartedMasterRestoresItsJournal) {
  MasterOptions o;
  o.journal = true;
  MasterState m(o);
  ASSERT_TRUE(m.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  ASSERT_TRUE(m.Mount("b0", "b", 1000, t0 + seconds(60)).ok());
  PutAll(m, Keys(0, 3), 100, t0, "a");
  PutAll(m, Keys(3, 4), 100, t0, "b");
  m.Remove(Keys(2, 3), t0);  // gone before the crash: not in the journal
  std::vector<SegmentRecord> segments;
  std::vector<ObjectRecord> objects;
  Journal(m, &segments, &objects);
  EXPECT_EQ(segments.size(), 2u);
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_TRUE(m.TakeChanges().objects.empty());  // taken

  // Readers need not hash what this master committed; they must verify what it restores.
  EXPECT_FALSE(m.GetPrefix(Keys(0, 1), t0, t0)[0].verify);
  MasterState restarted(o);
  EXPECT_EQ(restarted.Restore(segments, objects, t0 + seconds(5)), 3);
  EXPECT_TRUE(restarted.GetPrefix(Keys(0, 1), t0, t0)[0].verify);
  EXPECT_EQ(restarted.GetPrefix(Keys(0, 2), t0, t0).size(), 2u);
  EXPECT_EQ(restarted.GetPrefix(Keys(0, 1), t0, t0)[0].checksum, 42u);
  EXPECT_EQ(restarted.GetPrefix(Keys(3, 4), t0, t0)[0].replicas[0].segment, "b0");
  EXPECT_EQ(restarted.used(), 300u);
  // New puts never land on restored objects' bytes.
  const auto r = restarted.PutStart(Keys(10, 17), 100, 1, "a", t0, t0 + seconds(5));
  for (const auto& x : r) {
    for (const Location& l : x.locations) {
      for (const ObjectRecord& old : objects) {
        const Location& o2 = old.replicas[0];
        if (o2.segment != l.segment) continue;
        EXPECT_TRUE(l.offset + l.size <= o2.offset || o2.offset + o2.size <= l.offset)
            << l.segment << "@" << l.offset << " overlaps " << old.key;
      }
    }
  }
  // Segments whose owners never come back go at their deadline, with their objects.
  ASSERT_TRUE(restarted.Mount("a0", "a", 1000, t0 + seconds(60)).ok());
  restarted.Expire(t0 + seconds(6));
  EXPECT_EQ(restarted.GetPrefix(Keys(3, 4), t0 + seconds(6), t0 + seconds(6)).size(), 0u);
  EXPECT_EQ(restarted.GetPrefix(Keys(0, 2), t0 + seconds(6), t0 + seconds(6)).size(), 2u);
}

TEST(MasterStateTest, RestoreDropsRecordsThatOverlapOrPointNowhere) {
  MasterState m;
  const std::vector<SegmentRecord> segments = {{"a0", "a", 1000}};
  const std::vector<ObjectRecord> objects = {
      {"ns/x", 100, 1, {{"a0", "a", 0, 100}}},
      {"ns/y", 100, 2, {{"a0", "a", 64, 100}}},   // overlaps x: stale
      {"ns/z", 100, 3, {{"gone", "c", 0, 100}}},  // segment unknown
      {"ns/w", 100, 4, {{"a0", "a", 950, 100}}},  // past the segment's end
      {"ns/v", 100, 5, {{"a0", "a", 128, 50}}},   // size differs from the object's
      {"ns/u", 100, 6, {{"a0", "a", 128, 100}}},
  };
  EXPECT_EQ(m.Restore(segments, objects, t0 + seconds(5)), 2);
  EXPECT_EQ(m.Exist({"ns/x", "ns/y", "ns/z", "ns/w", "ns/v", "ns/u"}),
            (std::vector<bool>{true, false, false, false, false, true}));
  EXPECT_EQ(m.counters().restored, 2u);
}

}  // namespace
}  // namespace tandem::store
