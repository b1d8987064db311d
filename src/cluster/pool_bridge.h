// The serving loop's view of the cluster KV pool (serving::KvPool over store::PoolClient): keys
// of the local prefix cache become pool object keys in the model's namespace. A block object is
// one KV block's global-arena bytes (every global layer's slice of the block, contiguous in the
// worker's layout); a window object (sliding-window models) is one window block's bytes (every
// sliding layer's slice, contiguous in the window arena), under the same prefix hash in the
// namespace store::WindowNamespace(ns()). Both are read into and written from the worker's own KV
// segment.
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
  // model: the model file's name (with the KV shape, the namespace of its objects).
  PoolBridge(store::PoolClient* client, engine::PagedKvCache* kv, const std::string& model,
             std::chrono::milliseconds fetch_timeout, std::chrono::milliseconds put_timeout);

  int Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override;
  void Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override;
  std::vector<bool> HeldWindows(std::span<const uint64_t> keys) override;
  int FetchWindows(std::span<const uint64_t> keys, std::span<const int32_t> window_blocks) override;
  void OfferWindows(std::span<const uint64_t> keys,
                    std::span<const int32_t> window_blocks) override;

  const std::string& ns() const { return ns_; }

 private:
  static std::vector<std::string> ObjectKeys(const std::string& ns, std::span<const uint64_t> keys);
  void* BlockData(int32_t block) const {
    return kv_->data() + static_cast<size_t>(block) * kv_->BlockBytes();
  }
  void* WindowData(int32_t window_block) const {
    return kv_->data() + kv_->WindowArenaOffset() +
           static_cast<size_t>(window_block) * kv_->shape().WindowBlockBytes();
  }

  store::PoolClient* client_;
  engine::PagedKvCache* kv_;
  std::string ns_;
  std::string window_ns_;  // store::WindowNamespace(ns_)
  std::chrono::milliseconds fetch_timeout_, put_timeout_;
};

}  // namespace tandem::cluster
