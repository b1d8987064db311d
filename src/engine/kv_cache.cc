#include "engine/kv_cache.h"

#include <cstdlib>
#include <cstring>

namespace tandem::engine {

void KvMemoryDeleter::operator()(uint8_t* p) const {
  if (owned) std::free(p);
}

PagedKvCache::PagedKvCache(const KvCacheShape& shape)
    : shape_(shape),
      layer_slice_bytes_(2 * sizeof(uint16_t) * static_cast<size_t>(shape.n_kv_heads) *
                         shape.block_tokens * shape.head_dim) {}

namespace {

Status CheckShape(const KvCacheShape& shape) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_tokens <= 0 || shape.num_blocks <= 0) {
    return InvalidArgument("KV cache shape has a non-positive dimension");
  }
  return OkStatus();
}

}  // namespace

size_t PagedKvCache::RequiredBytes(const KvCacheShape& shape) {
  return (PagedKvCache(shape).SizeBytes() + 63) / 64 * 64;
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvCacheShape& shape) {
  TANDEM_RETURN_IF_ERROR(CheckShape(shape));
  const size_t bytes = RequiredBytes(shape);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) {
    return ResourceExhausted("cannot allocate " + std::to_string(bytes >> 20) +
                             " MiB for the KV cache");
  }
  auto kv = CreateOn(shape, p, bytes);
  if (!kv.ok()) {
    std::free(p);
    return kv.status();
  }
  (*kv)->data_.get_deleter().owned = true;
  return kv;
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::CreateOn(const KvCacheShape& shape,
                                                               uint8_t* memory, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(CheckShape(shape));
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % 64 != 0) {
    return InvalidArgument("KV cache memory must be non-null and 64-byte aligned");
  }
  if (bytes < RequiredBytes(shape)) {
    return InvalidArgument("KV cache memory holds " + std::to_string(bytes) + " bytes; " +
                           std::to_string(RequiredBytes(shape)) + " needed");
  }
  std::unique_ptr<PagedKvCache> kv(new PagedKvCache(shape));
  std::memset(memory, 0, RequiredBytes(shape));
  kv->data_ = std::unique_ptr<uint8_t, KvMemoryDeleter>(memory, KvMemoryDeleter{false});
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
