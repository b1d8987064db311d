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
//   PutEnd    ok: the object becomes visible; not ok: the space is freed. A writer that never
//             calls it (it died) loses the reservation at its deadline: nothing visible is left.
//   GetPrefix returns the longest prefix of a key list that is visible, with every replica's
//             location, and leases those objects to the reader until a deadline.
//   Remove    drops objects (at once, or once their leases end).
// Eviction is least recently used (a get or a put counts as a use) between watermarks: when a
// put would take the pool above `high_watermark` of its capacity, objects are evicted until it
// is at or below `low_watermark`; a leased object or one being written is never evicted.
// Segments come and go with their nodes: a segment whose lease was not renewed (Mount again)
// by its deadline is dropped with the replicas it held; an object left without a replica
// disappears.
//
// Thread-safety: none (the server serializes calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
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
  // Commits (ok) or aborts reservations. A key not being written is ignored.
  void PutEnd(const std::vector<std::string>& keys, const std::vector<bool>& ok);

  // The longest prefix of `keys` whose objects are all visible: one entry per key, each the
  // object's replica locations; the objects are leased (not evictable) until `lease_deadline`.
  std::vector<std::vector<Location>> GetPrefix(const std::vector<std::string>& keys,
                                               Clock::time_point now,
                                               Clock::time_point lease_deadline);
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
    std::vector<Location> replicas;
    bool visible = false;
    bool remove_pending = false;
    Clock::time_point write_deadline;          // !visible
    Clock::time_point lease_deadline;          // readers hold it until then
    std::list<std::string>::iterator lru_pos;  // visible only: in lru_
  };

  bool Allocate(Segment& seg, uint64_t size, uint64_t* offset);
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
};

}  // namespace tandem::store
