// A store of KV blocks beyond this engine's own prefix cache (the cluster's KV pool,
// store/pool.h, sits behind it in a worker). The serving loop asks it for the part of a prompt
// its local cache lacks before computing, and offers it the full blocks it computed.
//
// Two kinds of object under a block's key (the prefix hash of serving/block_keys.h):
//   - the block: its global-arena bytes (engine/kv_cache.h: every global layer's slice);
//   - its window (models with sliding-window layers only): the bytes of the window block it
//     holds, every sliding layer's slice. A sequence resumes from the end of a prefix of n
//     blocks only with the windows of the blocks a query at position n * block_tokens reads
//     (PagedKvCache::WindowStartBlock), so windows are offered where a block still has one
//     (the last window of each finished or preempted sequence) and read only for those blocks.
//
// Thread-safety: called on the serving loop's thread only; each call bounded by a deadline of
// its own, and failures are the implementation's to count (the loop then computes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::serving {

class KvPool {
 public:
  virtual ~KvPool() = default;
  // Reads the KV of the longest prefix of `keys` (prefix-hash keys of consecutive full blocks)
  // the pool holds into `blocks` (blocks[i] for keys[i], the caller's fresh blocks; same
  // length). Returns how many leading blocks now hold their key's KV.
  virtual int Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) = 0;
  // Offers full blocks whose KV is complete, under their keys (blocks[i] holds keys[i]).
  virtual void Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) = 0;

  // Windows (sliding-window models). Which of `keys` the pool holds the window of (no data
  // moves; all false when it cannot tell).
  virtual std::vector<bool> HeldWindows(std::span<const uint64_t> keys) = 0;
  // Reads the windows of the longest prefix of `keys` the pool holds into `window_blocks`
  // (window-arena block ids, one per key). Returns how many leading windows were read.
  virtual int FetchWindows(std::span<const uint64_t> keys,
                           std::span<const int32_t> window_blocks) = 0;
  // Offers windows whose KV is complete (window_blocks[i] holds the window of keys[i]).
  virtual void OfferWindows(std::span<const uint64_t> keys,
                            std::span<const int32_t> window_blocks) = 0;
};

}  // namespace tandem::serving
