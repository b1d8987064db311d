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

serving::KvPool::Fetched PoolBridge::Fetch(
    std::span<const uint64_t> keys, const std::function<std::vector<int32_t>(int)>& allocate) {
  Fetched out;
  if (keys.empty()) return out;
  const auto deadline = store::Clock::now() + fetch_timeout_;
  auto prefix = client_->Lookup(ObjectKeys(keys), deadline);
  if (!prefix.ok() || prefix->keys.empty()) return out;  // a miss, or no master (counted)
  out.blocks = allocate(static_cast<int>(prefix->keys.size()));
  std::vector<void*> dests;
  for (int32_t b : out.blocks) dests.push_back(BlockData(b));
  out.filled = client_->Read(*prefix, dests, kv_->BlockBytes(), deadline);
  return out;
}

void PoolBridge::Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) {
  std::vector<void*> srcs;
  for (int32_t b : blocks) srcs.push_back(BlockData(b));
  // Failures are counted by the client; the blocks stay in the local cache either way.
  (void)client_->Put(ObjectKeys(keys), srcs, kv_->BlockBytes(), store::Clock::now() + put_timeout_);
}

}  // namespace tandem::cluster
