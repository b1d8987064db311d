// Paged KV cache: a pool of fixed-size blocks shared by all sequences, and its block allocator.
//
// Memory layout (one contiguous, 64-byte aligned buffer):
//   block b, layer l  ->  a "layer slice" of LayerSliceBytes() at byte
//                         ((b * n_layers) + l) * LayerSliceBytes()
//   inside a slice:       K (n_kv_heads, head_dim, block_tokens) fp16 (keys transposed, so
//                         one dimension of a block's keys is contiguous for attention), then
//                         V (n_kv_heads, block_tokens, head_dim) fp16
// So one layer of one block is one contiguous range: the unit the transfer engine moves, and
// layer-wise streaming of a request is a list of (offset, length) pairs.
//
// Thread-safety: the allocator is not thread-safe (owned by the engine loop). Forward passes
// write disjoint slots of blocks owned by their sequences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"

namespace tandem::engine {

struct KvCacheShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;  // tokens per block
  int num_blocks = 0;

  // KV bytes one token occupies: K and V, fp16, every layer (blocks add no padding when a
  // layer slice is a multiple of 64 bytes, as for every model we ship).
  int64_t BytesPerToken() const {
    return int64_t{2} * n_layers * n_kv_heads * head_dim * static_cast<int64_t>(sizeof(uint16_t));
  }
};

// Frees the cache's memory when it owns it (Create), not when the caller does (CreateOn).
struct KvMemoryDeleter {
  bool owned = true;
  void operator()(uint8_t* p) const;
};

class PagedKvCache {
 public:
  static StatusOr<std::unique_ptr<PagedKvCache>> Create(const KvCacheShape& shape);
  // The same over caller-owned memory (e.g. a shared-memory segment the transfer engine
  // publishes), which must be 64-byte aligned, hold RequiredBytes(shape) and outlive the cache.
  // The memory is zeroed.
  static StatusOr<std::unique_ptr<PagedKvCache>> CreateOn(const KvCacheShape& shape,
                                                          uint8_t* memory, size_t bytes);
  // Bytes a cache of this shape needs (rounded up to 64).
  static size_t RequiredBytes(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  size_t LayerSliceBytes() const { return layer_slice_bytes_; }
  size_t BlockBytes() const { return layer_slice_bytes_ * shape_.n_layers; }
  size_t SizeBytes() const { return BlockBytes() * shape_.num_blocks; }
  uint8_t* data() { return data_.get(); }
  size_t LayerSliceOffset(int32_t block, int layer) const {
    return (static_cast<size_t>(block) * shape_.n_layers + layer) * layer_slice_bytes_;
  }

  // (head_dim, block_tokens) fp16 keys of one kv head in one block and layer: element
  // [d * block_tokens + slot].
  uint16_t* Keys(int32_t block, int layer, int kv_head) {
    return reinterpret_cast<uint16_t*>(data_.get() + LayerSliceOffset(block, layer)) +
           static_cast<size_t>(kv_head) * shape_.block_tokens * shape_.head_dim;
  }
  // (block_tokens, head_dim) fp16 values: element [slot * head_dim + d]. Values follow all
  // keys of the slice.
  uint16_t* Values(int32_t block, int layer, int kv_head) {
    return Keys(block, layer, kv_head) +
           static_cast<size_t>(shape_.n_kv_heads) * shape_.block_tokens * shape_.head_dim;
  }

  // Block allocation with reference counts (a block shared by a cached prefix has several
  // holders). Allocate is all-or-nothing.
  StatusOr<std::vector<int32_t>> Allocate(int n);
  void AddRef(int32_t block);
  void Release(int32_t block);
  void Release(const std::vector<int32_t>& blocks);
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return shape_.num_blocks; }
  int ref_count(int32_t block) const { return refs_[block]; }

  // Blocks needed to hold n_tokens tokens.
  int BlocksFor(int64_t n_tokens) const {
    return static_cast<int>((n_tokens + shape_.block_tokens - 1) / shape_.block_tokens);
  }

 private:
  explicit PagedKvCache(const KvCacheShape& shape);

  KvCacheShape shape_;
  size_t layer_slice_bytes_;
  std::unique_ptr<uint8_t, KvMemoryDeleter> data_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<int32_t> refs_;  // per block
};

}  // namespace tandem::engine
