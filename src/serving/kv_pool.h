// A store of KV blocks beyond this engine's own prefix cache (the cluster's KV pool,
// store/pool.h, sits behind it in a worker). The serving loop asks it for the part of a prompt
// its local cache lacks before computing, and offers it the full blocks it computed.
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
};

}  // namespace tandem::serving
