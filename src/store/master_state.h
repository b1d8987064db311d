// The KV pool master's bookkeeping as a pure state machine: which storage segment holds which
// object, where in it, who is writing or reading it, and what to evict. No I/O and no clock of
// its own (every call takes `now`), so the policy is tested by calling it; master_server.h puts
// it behind HTTP with a lock.
//
// Objects are immutable byte strings (a KV block in a worker's layout) under string keys (the
// namespace of the KV geometry + the block's prefix hash, store/pool_key.h). Life of an object:
//   PutStart  reserves space for it on up to `replicas` segments of distinct nodes; it is not
//             visible yet. The writer then writes the bytes itself (the master is off the data
//             path) and calls
//   PutEnd    ok: the object becomes visible with the checksum of its bytes (XXH3-64, which
//             readers verify where the master cannot vouch for the bytes: FoundObject::verify);
//             not ok: the space is freed. A writer that never calls it
//             (it died) loses the reservation at its deadline: nothing visible is left.
//   GetPrefix returns the longest prefix of a key list that is visible, with every replica's
//             location, and leases those objects to the reader until a deadline. An object read
//             often (`hot_gets` gets) is given one more replica on another node, up to
//             `max_replicas`: the reader that has just read it writes the copy (ReplicaEnd), so
//             the master stays off the data path.
//   Remove    drops objects (at once, or once their leases end).
// Eviction is least recently used (a get or a put counts as a use) between watermarks: when a
// put would take the pool above `high_watermark` of its capacity, objects are evicted until it
// is at or below `low_watermark`; a leased object or one being written is never evicted.
// Segments come and go with their nodes: a segment whose lease was not renewed (Mount again)
// by its deadline is dropped with the replicas it held; an object left without a replica
// disappears.
// Durable state: with `journal` on, every change of a visible object or of a segment is noted
// (TakeChanges); the master server writes those records to the metadata service, and a
// restarted master Restores them. A restored record may be stale (the object was evicted and its
// space reused just before a crash): readers verify the checksum, so a stale record is a miss,
// never wrong KV.
//
// Thread-safety: none (the server serializes calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tandem::store {

using Clock = std::chrono::steady_clock;

// Where one replica of an object lives: bytes [offset, offset + size) of a segment.
struct Location {
  std::string segment;
  std::string node;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct MasterOptions {
  double high_watermark = 0.95;  // of the mounted capacity
  double low_watermark = 0.80;
  uint64_t alignment = 64;  // object offsets are multiples of this
  // Hot-prefix replication: after this many gets since its last new replica an object is given
  // one more, up to max_replicas (0: never).
  int hot_gets = 0;
  int max_replicas = 2;
  bool journal = false;  // note changes for TakeChanges
};

// A visible object as GetPrefix returns it.
struct FoundObject {
  uint64_t checksum = 0;  // XXH3-64 of its bytes
  // Whether the reader must verify the checksum: the master vouches for the bytes of objects
  // committed in its own lifetime (their space was never given to anyone else while they were
  // visible, and segment names change with every incarnation of their owner), not for objects
  // restored from a journal (the record may be stale).
  bool verify = false;
  std::vector<Location> replicas;  // at least one
  // Hot-prefix replication: a reserved location (size == 0: none) to which the reader copies
  // the bytes it read, then reports with ReplicaEnd.
  Location replicate_to;
};

// The durable records of the master's state (what a restarted master needs).
struct ObjectRecord {
  std::string key;
  uint64_t size = 0, checksum = 0;
  std::vector<Location> replicas;
};
struct SegmentRecord {
  std::string name, node;
  uint64_t capacity = 0;
};
struct MasterChanges {
  std::vector<std::string> objects;   // keys whose record changed (ObjectRecordOf: now)
  std::vector<std::string> segments;  // segments mounted or dropped
};

// Outcome of one key of a PutStart.
enum class PutDecision {
  kReserved,  // write to `locations`, then PutEnd
  kExists,    // already visible or being written: nothing to do
  kNoSpace,   // every candidate segment is full of objects that cannot be evicted now
};

struct PutReservation {
  PutDecision decision = PutDecision::kNoSpace;
  std::vector<Location> locations;  // kReserved only
};

struct SegmentUsage {
  std::string name, node;
  uint64_t capacity = 0, used = 0;  // bytes (used: visible and reserved objects)
  int objects = 0;                  // replicas stored here
};

struct MasterCounters {
  uint64_t puts_committed = 0, puts_aborted = 0, puts_expired = 0;
  uint64_t puts_no_space = 0, puts_existing = 0;
  uint64_t get_hits = 0, get_misses = 0;  // keys found / the first key not found per GetPrefix
  uint64_t evictions = 0;                 // objects evicted for space
  uint64_t replicas_lost = 0;             // replicas dropped with their segment
  uint64_t objects_lost = 0;              // objects that lost their last replica
  uint64_t removed = 0;
  uint64_t hot_replicas = 0;  // replicas added to hot objects
  uint64_t restored = 0;      // objects taken from a journal (Restore)
};

class MasterState {
 public:
  explicit MasterState(MasterOptions options = {});

  // Adds a storage segment of `capacity` bytes owned by `node`, or renews its lease (same name
  // and capacity). Its objects survive while it is renewed before `lease_deadline`.
  // InvalidArgument for a zero capacity or a known name with another capacity or node.
  Status Mount(const std::string& segment, const std::string& node, uint64_t capacity,
               Clock::time_point lease_deadline);
  // Drops a segment and every replica on it (OK if unknown).
  void Unmount(const std::string& segment);

  // Reserves space for each key (objects of `size` bytes) on up to `replicas` segments, each on
  // a distinct node, preferring `writer_node`'s own segment, then the emptiest. The reservation
  // lapses at `write_deadline` unless PutEnd commits it first.
  std::vector<PutReservation> PutStart(const std::vector<std::string>& keys, uint64_t size,
                                       int replicas, const std::string& writer_node,
                                       Clock::time_point now, Clock::time_point write_deadline);
  // Commits (ok) or aborts reservations; checksums[i]: of the bytes written for keys[i]. A key
  // not being written is ignored.
  void PutEnd(const std::vector<std::string>& keys, const std::vector<bool>& ok,
              const std::vector<uint64_t>& checksums);

  // The longest prefix of `keys` whose objects are all visible, one entry per key; the objects
  // are leased (not evictable) until `lease_deadline`, and so is a replica location reserved for
  // a hot object.
  std::vector<FoundObject> GetPrefix(const std::vector<std::string>& keys, Clock::time_point now,
                                     Clock::time_point lease_deadline);
  // The reader reports the copy to a FoundObject::replicate_to (on `segment`): ok adds the
  // replica; not ok frees it. Unknown pairs are ignored.
  void ReplicaEnd(const std::string& key, const std::string& segment, bool ok);
  // Whether each key is visible (no lease, no use).
  std::vector<bool> Exist(const std::vector<std::string>& keys) const;
  // A reader reports that a replica could not be read (its node may be gone): that replica is
  // dropped; the object with it when it was the last.
  void ReportBadReplica(const std::string& key, const std::string& segment);
  // Removes objects; one that is leased or being written is removed when that ends. Returns
  // how many keys were known.
  int Remove(const std::vector<std::string>& keys, Clock::time_point now);

  // Lapsed reservations and segment leases, deferred removals. Call periodically.
  void Expire(Clock::time_point now);

  // Durable state. TakeChanges returns (and forgets) what changed since its last call (journal
  // on). ObjectRecordOf / SegmentRecordOf: the current record, or false when there is none (the
  // object or segment is gone: its record is to be deleted).
  MasterChanges TakeChanges();
  bool ObjectRecordOf(const std::string& key, ObjectRecord* out) const;
  bool SegmentRecordOf(const std::string& name, SegmentRecord* out) const;
  // Takes a journal's records (a restarted master, before it serves): segments are mounted
  // with `segment_deadline` (their owners' heartbeats renew them), then each object's replicas
  // that lie inside a known segment and overlap nothing restored before it. Returns how many
  // objects became visible.
  int Restore(const std::vector<SegmentRecord>& segments, const std::vector<ObjectRecord>& objects,
              Clock::time_point segment_deadline);

  std::vector<SegmentUsage> Usage() const;
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  size_t visible_objects() const { return lru_.size(); }
  const MasterCounters& counters() const { return counters_; }

 private:
  struct Segment {
    std::string node;
    uint64_t capacity = 0;
    uint64_t used = 0;
    Clock::time_point lease_deadline;
    std::map<uint64_t, uint64_t> free;  // offset -> length, coalesced
    int objects = 0;
  };
  struct Object {
    uint64_t size = 0;
    uint64_t checksum = 0;
    std::vector<Location> replicas;
    Location pending_replica;            // size 0: none; reserved for a hot copy
    Clock::time_point pending_deadline;  // the pending replica is freed then
    int gets = 0;                        // since its last new replica
    bool restored = false;               // from a journal: readers verify its bytes
    bool visible = false;
    bool remove_pending = false;
    Clock::time_point write_deadline;          // !visible
    Clock::time_point lease_deadline;          // readers hold it until then
    std::list<std::string>::iterator lru_pos;  // visible only: in lru_
  };

  bool Allocate(Segment& seg, uint64_t size, uint64_t* offset);
  // Carves [offset, offset + size) out of the free list; false if any of it is taken.
  bool AllocateAt(Segment& seg, uint64_t offset, uint64_t size);
  // A free location for one more replica of `o` on a node that holds none (emptiest first).
  bool ReserveExtraReplica(Object& o, Location* out);
  void NoteObject(const std::string& key) {
    if (options_.journal) changed_objects_.insert(key);
  }
  void NoteSegment(const std::string& name) {
    if (options_.journal) changed_segments_.insert(name);
  }
  void Release(const Location& loc);
  void Drop(std::unordered_map<std::string, Object>::iterator it);
  // Evicts least recently used evictable objects until used_ + incoming <= low watermark of
  // capacity (or nothing evictable is left).
  void MakeRoom(uint64_t incoming, Clock::time_point now);
  bool Evictable(const Object& o, Clock::time_point now) const {
    return o.visible && o.lease_deadline <= now;
  }

  MasterOptions options_;
  std::map<std::string, Segment> segments_;
  std::unordered_map<std::string, Object> objects_;
  std::list<std::string> lru_;  // visible keys, most recently used first
  uint64_t capacity_ = 0, used_ = 0;
  MasterCounters counters_;
  std::set<std::string> changed_objects_, changed_segments_;  // journal on
};

}  // namespace tandem::store
