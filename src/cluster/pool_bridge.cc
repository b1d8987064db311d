#include "cluster/pool_bridge.h"

namespace tandem::cluster {

PoolBridge::PoolBridge(store::PoolClient* client, engine::PagedKvCache* kv,
                       const std::string& model, std::chrono::milliseconds fetch_timeout,
                       std::chrono::milliseconds put_timeout)
    : client_(client),
      kv_(kv),
      ns_(store::PoolNamespace(model, kv->shape().n_layers, kv->shape().n_kv_heads,
                               kv->shape().head_dim, kv->shape().block_tokens, "f16")),
      window_ns_(store::WindowNamespace(ns_)),
      fetch_timeout_(fetch_timeout),
      put_timeout_(put_timeout) {}

std::vector<std::string> PoolBridge::ObjectKeys(const std::string& ns,
                                                std::span<const uint64_t> keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (uint64_t k : keys) out.push_back(store::ObjectKey(ns, k));
  return out;
}

int PoolBridge::Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) {
  if (keys.empty()) return 0;
  std::vector<void*> dests;
  for (int32_t b : blocks) dests.push_back(BlockData(b));
  const auto deadline = store::Clock::now() + fetch_timeout_;
  auto filled = client_->GetPrefix(ObjectKeys(ns_, keys), dests, kv_->BlockBytes(), deadline);
  return filled.ok() ? *filled : 0;  // a miss, or no master (counted by the client)
}

void PoolBridge::Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) {
  std::vector<void*> srcs;
  for (int32_t b : blocks) srcs.push_back(BlockData(b));
  // Failures are counted by the client; the blocks stay in the local cache either way.
  (void)client_->Put(ObjectKeys(ns_, keys), srcs, kv_->BlockBytes(),
                     store::Clock::now() + put_timeout_);
}

std::vector<bool> PoolBridge::HeldWindows(std::span<const uint64_t> keys) {
  if (keys.empty()) return {};
  auto held = client_->Exist(ObjectKeys(window_ns_, keys), store::Clock::now() + fetch_timeout_);
  if (!held.ok() || held->size() != keys.size()) return std::vector<bool>(keys.size(), false);
  return *held;
}

int PoolBridge::FetchWindows(std::span<const uint64_t> keys,
                             std::span<const int32_t> window_blocks) {
  if (keys.empty()) return 0;
  std::vector<void*> dests;
  for (int32_t w : window_blocks) dests.push_back(WindowData(w));
  auto filled =
      client_->GetPrefix(ObjectKeys(window_ns_, keys), dests, kv_->shape().WindowBlockBytes(),
                         store::Clock::now() + fetch_timeout_);
  return filled.ok() ? *filled : 0;
}

void PoolBridge::OfferWindows(std::span<const uint64_t> keys,
                              std::span<const int32_t> window_blocks) {
  if (keys.empty()) return;
  std::vector<void*> srcs;
  for (int32_t w : window_blocks) srcs.push_back(WindowData(w));
  (void)client_->Put(ObjectKeys(window_ns_, keys), srcs, kv_->shape().WindowBlockBytes(),
                     store::Clock::now() + put_timeout_);
}

}  // namespace tandem::cluster
