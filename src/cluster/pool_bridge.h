// The serving loop's view of the cluster KV pool (serving::KvPool over store::PoolClient): keys
// of the local prefix cache become pool object keys in the model's namespace, and a pool object
// is one KV block's global-arena bytes (every layer's slice of the block, contiguous in the
// worker's layout), read from or written to the worker's own KV segment.
//
// Thread-safety: called on the serving loop's thread (serving::KvPool); the client is
// thread-safe and outlives the bridge.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/kv_cache.h"
#include "serving/kv_pool.h"
#include "store/pool.h"

namespace tandem::cluster {

class PoolBridge final : public serving::KvPool {
 public:
  // kv must not slide (NumSlidingLayers() == 0): a pool object is the global arena of a block.
  // model: the model file's name (with the KV shape, the namespace of its objects).
  PoolBridge(store::PoolClient* client, engine::PagedKvCache* kv, const std::string& model,
             std::chrono::milliseconds fetch_timeout, std::chrono::milliseconds put_timeout);

  int Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override;
  void Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override;

  const std::string& ns() const { return ns_; }

 private:
  std::vector<std::string> ObjectKeys(std::span<const uint64_t> keys) const;
  void* BlockData(int32_t block) const {
    return kv_->data() + static_cast<size_t>(block) * kv_->BlockBytes();
  }

  store::PoolClient* client_;
  engine::PagedKvCache* kv_;
  std::string ns_;
  std::chrono::milliseconds fetch_timeout_, put_timeout_;
};

}  // namespace tandem::cluster
