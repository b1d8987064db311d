// The KV cache pool: a cluster-wide store of KV blocks in the spare DRAM of every worker (and of
// standalone store processes), so that a prompt prefix computed anywhere is fetched instead of
// recomputed. Mooncake Store's shape:
//   - a master (PoolMasterServer; embedded in `tandem serve`) knows which segment holds which
//     object; it is off the data path;
//   - storage segments are transfer-engine segments (shared memory on a host, TCP across
//     hosts), mounted with the master by their owner and kept by a heartbeat;
//   - clients (PoolClient) ask the master where objects are (or where to write them) and move
//     the bytes themselves with the transfer engine.
//
// Objects are KV blocks keyed by ObjectKey(namespace, prefix hash): the hash chain of
// serving/block_keys.h, so a key stands for the whole prefix up to its block; the namespace
// names the model and KV geometry, so incompatible workers never share.
//
//   PoolClientOptions o; o.engine = te; o.metadata = meta; o.node = "host-a";
//   auto pool = PoolClient::Create(o);                       // finds the master in `meta`
//   (*pool)->MountDram("prefill-0/pool", 256 << 20);         // contribute 256 MiB
//   int n = *(*pool)->GetPrefix(keys, dests, block_bytes, deadline);   // leading hits, read
//   (*pool)->Put(keys, srcs, block_bytes, deadline);          // offer computed blocks
//
// Every call has a deadline and ends in a clear status; a master that does not answer is
// kUnavailable (callers recompute: the pool is a cache). Thread-safety: PoolClient is
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "store/master_state.h"
#include "store/pool_stats.h"

namespace tandem::transfer {
class MetadataStore;
class TransferEngine;
}  // namespace tandem::transfer

namespace tandem::store {

// The metadata key under which the master publishes its HTTP address.
inline constexpr const char* kMasterKey = "tandem/pool/master";
// Where a master with a journal keeps its state's records (bound to no lease).
inline constexpr const char* kJournalPrefix = "tandem/pool/state/";

// A namespace for the blocks of one model and KV layout: the model file's name, its layer
// count, KV heads, head dimension, tokens per block and element type. Workers whose namespaces
// differ never see each other's objects.
std::string PoolNamespace(const std::string& model, int n_layers, int n_kv_heads, int head_dim,
                          int block_tokens, const std::string& dtype);
// The key of one block: namespace + "/" + its prefix hash (16 hex digits).
std::string ObjectKey(const std::string& ns, uint64_t prefix_hash);
// Sliding-window models: the namespace of the blocks' windows (their sliding layers' KV), whose
// objects are keyed by the same prefix hashes.
std::string WindowNamespace(const std::string& ns);

struct PoolMasterOptions {
  MasterOptions policy;
  // How often lapsed leases and reservations are collected.
  std::chrono::milliseconds expire_interval{200};
  // Keep the state's records in the metadata service (under kJournalPrefix, durable) and
  // restore them at start, so that a restarted master, or a standby taking over, knows every
  // object that was stored. Needs `metadata`. Records are written every journal_interval; a
  // record lost in a crash costs a miss (an object forgotten) or nothing (readers verify
  // checksums, so a stale record is never wrong KV).
  bool journal = false;
  std::chrono::milliseconds journal_interval{100};
  // Restored segments live this long unless their owners renew them (longer than the clients'
  // segment TTL).
  std::chrono::milliseconds restore_grace{10000};
};

// The master behind HTTP (JSON bodies; the protocol is in docs/design/kv-pool.md). Publishes
// "http://host:port" under kMasterKey in `metadata` when one is given (the key lives as long as
// the metadata client's lease), so that clients find it and a restarted master replaces it.
class PoolMasterServer {
 public:
  static StatusOr<std::unique_ptr<PoolMasterServer>> Start(
      const std::string& host, int port, PoolMasterOptions options = {},
      std::shared_ptr<transfer::MetadataStore> metadata = nullptr);
  virtual ~PoolMasterServer() = default;
  virtual int port() const = 0;
  virtual std::string uri() const = 0;
  // A snapshot of the policy's state (tests, metrics).
  virtual std::vector<SegmentUsage> Usage() const = 0;
  virtual MasterCounters Counters() const = 0;
  // Journal writes that failed (retried) so far; 0 without a journal.
  virtual uint64_t JournalFailures() const = 0;
};

struct PoolClientOptions {
  // "http://host:port" of the master; empty: looked up under kMasterKey in `metadata` (again
  // after every failed call, so a restarted master is found).
  std::string master_uri;
  std::shared_ptr<transfer::MetadataStore> metadata;
  transfer::TransferEngine* engine = nullptr;  // moves the bytes; not owned, outlives the client
  std::string node;                            // this host (replicas go to distinct nodes)
  int replicas = 1;                            // per object, best effort
  // Bound on each master call (within the caller's deadline).
  std::chrono::milliseconds rpc_timeout{1000};
  // After a call finds no master, calls fail at once (Unavailable, counted) for this long, so
  // that a cluster without a master pays nothing per request.
  std::chrono::milliseconds master_retry{1000};
  // Segment heartbeat: the master drops a segment not renewed for `segment_ttl`.
  std::chrono::milliseconds segment_ttl{5000};
  // This node's SSD tier (store/ssd_tier.h; empty dir: none): every object this client offers
  // is also written there, and a lookup continues there where the DRAM pool's prefix ends
  // (blocks found there are offered to the DRAM pool again: promoted). It answers even while
  // no master does. Only this client reads it.
  std::string ssd_dir;
  uint64_t ssd_bytes = 0;
};

class PoolClient {
 public:
  static StatusOr<std::unique_ptr<PoolClient>> Create(PoolClientOptions options);
  virtual ~PoolClient() = default;  // unmounts its segments (best effort)

  // Allocates `bytes` of shared memory as transfer-engine segment `segment` and mounts it with
  // the master for other clients' objects. A background heartbeat renews the mount (and
  // re-mounts after a master restart). The mount succeeds even while no master answers.
  virtual Status MountDram(const std::string& segment, uint64_t bytes) = 0;

  // Reads the longest prefix of `keys` that the pool holds: object i (size bytes) into dests[i]
  // (memory registered with the engine, e.g. a KV block). Returns how many leading objects were
  // read (0 on a miss); an object that cannot be read, or whose bytes fail their checksum, ends
  // the prefix there (counted; the bad replica is reported to the master). Then the SSD tier,
  // if any, continues the prefix. Unavailable when no master answers and the SSD tier gave
  // nothing. The objects are leased to this reader (not evictable) until shortly after
  // `deadline`. A hot object may be copied to one more node on the way (the master asks).
  virtual StatusOr<int> GetPrefix(const std::vector<std::string>& keys,
                                  const std::vector<void*>& dests, uint64_t size,
                                  Clock::time_point deadline) = 0;
  // Stores objects (size bytes each from srcs[i], registered memory) the pool does not hold
  // yet; returns how many were newly stored. Objects that find no space are skipped (counted).
  virtual StatusOr<int> Put(const std::vector<std::string>& keys, const std::vector<void*>& srcs,
                            uint64_t size, Clock::time_point deadline) = 0;
  // Which of `keys` the pool holds (visible objects), or this node's SSD tier (which answers
  // alone while no master does).
  virtual StatusOr<std::vector<bool>> Exist(const std::vector<std::string>& keys,
                                            Clock::time_point deadline) = 0;
  virtual Status Remove(const std::vector<std::string>& keys, Clock::time_point deadline) = 0;

  virtual PoolClientStats Stats() const = 0;
};

// What the master reports of itself (GET /pool/stats), for metrics.
struct PoolMasterStats {
  uint64_t capacity = 0, used = 0, objects = 0;
  std::vector<SegmentUsage> segments;
  MasterCounters counters;
  uint64_t journal_failures = 0;
};

// The pool as a scheduler sees it: which prefix of a prompt's blocks the pool holds, asked of
// the master (Exist; no data moves, no lease). The conductor uses it to predict what a prefill
// worker will fetch instead of compute. Thread-safe.
struct PoolDirectoryOptions {
  std::string master_uri;  // empty: looked up under kMasterKey in `metadata`
  std::shared_ptr<transfer::MetadataStore> metadata;
  std::chrono::milliseconds rpc_timeout{100};    // on the request path: short
  std::chrono::milliseconds master_retry{1000};  // after a failure, calls fail at once this long
};

class PoolDirectory {
 public:
  static StatusOr<std::unique_ptr<PoolDirectory>> Create(PoolDirectoryOptions options);
  virtual ~PoolDirectory() = default;
  // How many leading keys the pool holds (visible objects); Unavailable without a master.
  virtual StatusOr<int> HeldPrefix(const std::vector<std::string>& keys,
                                   Clock::time_point deadline) = 0;
  // Which of `keys` the pool holds (visible objects), one answer per key.
  virtual StatusOr<std::vector<bool>> Held(const std::vector<std::string>& keys,
                                           Clock::time_point deadline) = 0;
  virtual uint64_t master_unavailable() const = 0;  // calls that found no master
  // The master's own figures (a standalone master's, for the conductor's /metrics).
  virtual StatusOr<PoolMasterStats> MasterStats(Clock::time_point deadline) = 0;
};

}  // namespace tandem::store
