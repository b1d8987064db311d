// The KV pool's SSD tier on one node: objects (KV blocks) kept as files in a directory, so that
// what the DRAM pool evicts can still be found on the node that offered it. One file per object,
// written to a temporary name and renamed into place, so a file is whole or absent; each holds
// its key and the XXH3-64 checksum of its bytes, verified on every read, so a torn or corrupted
// file is a miss (and deleted), never wrong KV. Least recently used files are deleted to stay
// within the capacity.
//
// File layout (little-endian): "TNDMKV01" (8 bytes) | key length u32 | 0 u32 | object size u64
// | checksum u64 | key bytes | object bytes. Name: 16 hex digits of XXH3-64(key) + ".kv" (a
// name collision is a key mismatch: a miss).
//
// Writes are asynchronous: Offer copies the bytes into a bounded queue and a writer thread
// writes them, so the serving loop never waits for the disk; a full queue drops the offer
// (counted). Reads are synchronous (the caller wants the bytes now).
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace tandem::store {

struct SsdTierOptions {
  std::string dir;                            // created if missing
  uint64_t capacity_bytes = 0;                // files (headers included) stay within this
  uint64_t queue_bytes = uint64_t{64} << 20;  // bytes of offers waiting for the writer
};

struct SsdTierStats {
  uint64_t capacity_bytes = 0, used_bytes = 0;
  uint64_t objects = 0;  // files indexed now
  uint64_t hits = 0, misses = 0;
  uint64_t written = 0;         // files written
  uint64_t dropped = 0;         // offers not written: queue full, or the write failed
  uint64_t write_failures = 0;  // writes that failed (disk full, unwritable)
  uint64_t corrupt = 0;         // files that failed their checks on read (deleted)
  uint64_t evictions = 0;       // files deleted for space
};

class SsdTier {
 public:
  // Creates the directory, checks that a file can be written there, and indexes the files a
  // previous process left (headers only; a file of the wrong length is deleted). Errors name
  // the directory.
  static StatusOr<std::unique_ptr<SsdTier>> Open(SsdTierOptions options);
  virtual ~SsdTier() = default;  // stops the writer (offers still queued are dropped)

  // Queues the object for writing unless it is stored or queued already. `bytes` is copied.
  // Returns false when it was dropped (queue full).
  virtual bool Offer(const std::string& key, const void* bytes, uint64_t size) = 0;
  // Reads the object into dest (size bytes). True only when the file is there, names this key,
  // has this size and its bytes match its checksum; on false dest may have been overwritten.
  virtual bool Read(const std::string& key, void* dest, uint64_t size) = 0;
  // Whether a file of the object is indexed (written; not checked until read).
  virtual bool Holds(const std::string& key) const = 0;
  // Waits until every offer queued so far is written or dropped (tests, shutdown).
  virtual void Flush() = 0;
  virtual SsdTierStats Stats() const = 0;
};

}  // namespace tandem::store
