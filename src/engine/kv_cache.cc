#include "engine/kv_cache.h"

#include <cstdlib>
#include <cstring>

namespace tandem::engine {

void PagedKvCache::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

PagedKvCache::PagedKvCache(const KvCacheShape& shape)
    : shape_(shape),
      layer_slice_bytes_(2 * sizeof(uint16_t) * static_cast<size_t>(shape.n_kv_heads) *
                         shape.block_tokens * shape.head_dim) {}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvCacheShape& shape) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_tokens <= 0 || shape.num_blocks <= 0) {
    return InvalidArgument("KV cache shape has a non-positive dimension");
  }
  std::unique_ptr<PagedKvCache> kv(new PagedKvCache(shape));
  const size_t bytes = (kv->SizeBytes() + 63) / 64 * 64;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) {
    return ResourceExhausted("cannot allocate " + std::to_string(bytes >> 20) +
                             " MiB for the KV cache");
  }
  std::memset(p, 0, bytes);
  kv->data_.reset(p);
  kv->refs_.assign(shape.num_blocks, 0);
  kv->free_.reserve(shape.num_blocks);
  for (int32_t b = shape.num_blocks - 1; b >= 0; --b) kv->free_.push_back(b);
  return kv;
}

StatusOr<std::vector<int32_t>> PagedKvCache::Allocate(int n) {
  if (n < 0 || n > num_free()) {
    return ResourceExhausted("KV cache: " + std::to_string(n) + " blocks wanted, " +
                             std::to_string(num_free()) + " free");
  }
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (int32_t b : out) refs_[b] = 1;
  return out;
}

void PagedKvCache::AddRef(int32_t block) { ++refs_[block]; }

void PagedKvCache::Release(int32_t block) {
  if (refs_[block] <= 0) return;  // double release is ignored rather than corrupting the pool
  if (--refs_[block] == 0) free_.push_back(block);
}

void PagedKvCache::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) Release(b);
}

}  // namespace tandem::engine
