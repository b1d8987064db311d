// Local prefix cache over a PagedKvCache: full KV blocks keyed by a hash chain over their
// tokens, so a new sequence can reuse the longest prefix already computed and compute only the
// rest. Blocks held only by the cache are evicted least recently used first.
//
// Keys are the prefix hash chain of serving/block_keys.h.
//
// Thread-safety: not thread-safe; owned by the serving loop, like the KV cache it indexes.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"

namespace tandem::serving {

class PrefixCache {
 public:
  // kv must outlive the cache.
  explicit PrefixCache(engine::PagedKvCache* kv);
  ~PrefixCache();  // releases the cache's references

  // serving::BlockKeys (block_keys.h).
  static std::vector<uint64_t> BlockKeys(std::span<const int32_t> tokens, int block_tokens,
                                         uint64_t seed = 0);

  // The blocks of the longest cached prefix of `keys`, at most max_blocks, in order, that a
  // sequence can resume from (with sliding layers: whose last window is still stored, see
  // PagedKvCache::ResumablePrefix). Each returned block carries a new reference owned by the
  // caller. Counts as a use (LRU).
  std::vector<int32_t> Match(std::span<const uint64_t> keys, int max_blocks);

  // Offers a computed full block under its key. The cache takes its own reference unless the
  // key is already cached (then nothing changes).
  void Insert(uint64_t key, int32_t block);

  // Frees up to n blocks that only the cache still references, least recently used first.
  // Returns how many were freed.
  int Evict(int n);
  // Takes back up to n window blocks (sliding layers' KV) of cached blocks that only the cache
  // references, least recently used first; the blocks stay cached (their prefixes then resume
  // only where an unbroken window remains). Returns how many were taken back.
  int EvictWindows(int n);
  // Whether the cache holds a reference to `block` (at most one).
  bool Holds(int32_t block) const { return held_[block] != 0; }

  // Sliding-window models. The cache reads no KV itself, so its reference does not keep a
  // block's window storage alive against the sequences that move past it, except where a
  // window is pinned: the blocks a cached prefix needs to be resumed from its end
  // (PagedKvCache::ResumablePrefix). The serving loop pins the window behind the end of each
  // prefix it offers, and unpins every window when the arena runs short.
  void PinWindow(int32_t block) {
    if (held_[block] != 0) held_[block] = 2;
  }
  bool PinsWindow(int32_t block) const { return held_[block] == 2; }
  void UnpinWindows();

  // Every cached key, in no particular order (what the worker reports to the conductor).
  std::vector<uint64_t> Keys() const;
  // Changes whenever the set of keys does (an insertion or an eviction).
  uint64_t version() const { return version_; }

  int cached_blocks() const { return static_cast<int>(entries_.size()); }
  // Cached blocks no sequence holds (evictable). O(cached blocks).
  int UnsharedBlocks() const;

 private:
  struct Entry {
    int32_t block;
    std::list<uint64_t>::iterator lru_pos;  // in lru_
  };
  engine::PagedKvCache* kv_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;    // keys, most recently used first
  std::vector<uint8_t> held_;  // per block of kv_: 0 not held, 1 held, 2 held with a pinned window
  uint64_t version_ = 0;
};

}  // namespace tandem::serving
