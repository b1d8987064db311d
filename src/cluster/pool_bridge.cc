#include "cluster/pool_bridge.h"

namespace tandem::cluster {

PoolBridge::PoolBridge(store::PoolClient* client, engine::PagedKvCache* kv,
                       const std::string& model, std::chrono::milliseconds fetch_timeout,
                       std::chrono::milliseconds put_timeout)
    : client_(client),
      kv_(kv),
      ns_(store::PoolNamespace(model, kv->shape().n_layers, kv->shape().n_kv_heads,
                               kv->shape().head_dim, kv->shape().block_tokens, "f16")),
      fetch_timeout_(fetch_timeout),
      put_timeout_(put_timeout) {}

std::vector<std::string> PoolBridge::ObjectKeys(std::span<const uint64_t> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (uint64_t k : keys) out.push_back(store::ObjectKey(ns_, k));
  return out;
}

int PoolBridge::Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) {
  if (keys.empty()) return 0;
  std::vector<void*> dests;
  for (int32_t b : blocks) dests.push_back(BlockData(b));
  const auto deadline = store::Clock::now() + fetch_timeout_;
  auto filled = client_->GetPrefix(ObjectKeys(keys), dests, kv_->BlockBytes(), deadline);
  return filled.ok() ? *filled : 0;  // a miss, or no master (counted by the client)
}

void PoolBridge::Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) {
  std::vector<void*> srcs;
  for (int32_t b : blocks) srcs.push_back(BlockData(b));
  // Failures are counted by the client; the blocks stay in the local cache either way.
  (void)client_->Put(ObjectKeys(keys), srcs, kv_->BlockBytes(), store::Clock::now() + put_timeout_);
}

}  // namespace tandem::cluster
