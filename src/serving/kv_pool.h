// A store of KV blocks beyond this engine's own prefix cache (the cluster's KV pool,
// store/pool.h, sits behind it in a worker). The serving loop asks it for the part of a prompt
// its local cache lacks before computing, and offers it the full blocks it computed.
//
// Thread-safety: called on the serving loop's thread only; each call bounded by a deadline of
// its own, and failures are the implementation's to count (the loop then computes).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tandem::serving {

class KvPool {
 public:
  virtual ~KvPool() = default;
  // Finds the longest prefix of `keys` (prefix-hash keys of consecutive full blocks) the pool
  // holds, asks `allocate(n)` for n fresh blocks (it may return fewer, or none), and reads the
  // KV of the first keys into them in order. Returns the blocks allocate gave, and how many
  // leading ones now hold their key's KV (the caller frees the rest).
  struct Fetched {
    std::vector<int32_t> blocks;
    int filled = 0;
  };
  virtual Fetched Fetch(std::span<const uint64_t> keys,
                        const std::function<std::vector<int32_t>(int)>& allocate) = 0;
  // Offers full blocks whose KV is complete, under their keys (blocks[i] holds keys[i]).
  virtual void Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) = 0;
};

}  // namespace tandem::serving
