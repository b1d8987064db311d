// Paged KV cache: a pool of fixed-size blocks shared by all sequences, and its block allocator.
//
// Memory layout (one contiguous, 64-byte aligned buffer), with G global layers and S sliding
// layers (G + S = n_layers; S = 0 for models without sliding-window attention):
//   global arena:  block b, global layer g   -> slice at ((b * G) + g) * LayerSliceBytes()
//   window arena:  window block w, sliding layer s
//                                            -> slice at WindowArenaOffset()
//                                                        + ((w * S) + s) * LayerSliceBytes()
//   inside a slice: K (n_kv_heads, head_dim, block_tokens) fp16 (keys transposed, so one
//                   dimension of a block's keys is contiguous for attention), then
//                   V (n_kv_heads, block_tokens, head_dim) fp16
// A layer is global or sliding by KvCacheShape::sliding; g and s count layers of one kind in
// layer order. Without sliding layers the window arena is empty and block b, layer l sits at
// ((b * n_layers) + l) * LayerSliceBytes(). One layer of one block is one contiguous range: the
// unit the transfer engine moves, and layer-wise streaming of a request is a list of
// (offset, length) pairs.
//
// Sliding layers (Gemma 3: five of every six) attend to the last window_tokens positions only,
// so their KV is needed only while a block's positions lie inside some query's window. A block
// id always owns its global slices; it borrows a window block (its sliding slices) from the
// window arena while it needs one (AttachWindow) and gives it back once every position it holds
// has left the window (TrimWindow) or when the block is freed. A 32k-token sequence so holds
// global KV for all its positions and sliding KV for about window_tokens positions.
//
// Thread-safety: the allocator is not thread-safe (owned by the engine loop). Forward passes
// write disjoint slots of blocks owned by their sequences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

namespace tandem::engine {

struct KvCacheShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;  // tokens per block
  int num_blocks = 0;
  // Sliding-window layers: sliding[l] marks layer l, whose queries see only the last
  // window_tokens positions (empty: every layer is global). Their KV lives in a window arena
  // of num_window_blocks blocks (0 with no sliding layer).
  std::vector<bool> sliding = {};
  int window_tokens = 0;
  int num_window_blocks = 0;

  bool IsSliding(int layer) const { return !sliding.empty() && sliding[layer]; }
  int NumSlidingLayers() const;
  int NumGlobalLayers() const { return n_layers - NumSlidingLayers(); }
  // Bytes of one layer of one block: K and V, fp16.
  int64_t SliceBytes() const {
    return int64_t{2} * n_kv_heads * head_dim * block_tokens *
           static_cast<int64_t>(sizeof(uint16_t));
  }
  // KV bytes one token occupies in every layer, as if none slid (blocks add no padding when a
  // layer slice is a multiple of 64 bytes, as for every model we ship).
  int64_t BytesPerToken() const { return TokenBytes(n_layers); }
  // KV bytes one token occupies in the global arena: what a sequence pays per position.
  int64_t GlobalBytesPerToken() const { return TokenBytes(NumGlobalLayers()); }
  // Bytes of one window block (every sliding layer's slice of one block).
  int64_t WindowBlockBytes() const { return SliceBytes() * NumSlidingLayers(); }
  // Window blocks that `sequences` sequences hold at most while one forward step computes
  // `step_tokens` positions in all: each sequence the blocks spanned by the window behind its
  // first query and its own new positions (at most ceil((window - 1) / block_tokens) + 2 plus
  // its share of the step's ceil(step_tokens / block_tokens)). 0 without sliding layers.
  int WindowBlocksFor(int sequences, int step_tokens) const;

 private:
  int64_t TokenBytes(int layers) const {
    return int64_t{2} * layers * n_kv_heads * head_dim * static_cast<int64_t>(sizeof(uint16_t));
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
  // Global-arena bytes of one block (its global layers' slices).
  size_t BlockBytes() const { return layer_slice_bytes_ * n_global_; }
  size_t WindowArenaOffset() const { return BlockBytes() * shape_.num_blocks; }
  size_t SizeBytes() const {
    return WindowArenaOffset() + layer_slice_bytes_ * n_sliding_ * shape_.num_window_blocks;
  }
  uint8_t* data() { return data_.get(); }
  // Offset of layer `layer` of `block`, given the window block that holds its sliding slices
  // (ignored for a global layer). The same formula places a peer's slices, given the peer's
  // WindowArenaOffset (window_arena), which depends on its number of blocks.
  size_t SliceOffsetIn(size_t window_arena, int32_t block, int32_t window_block, int layer) const {
    const size_t index = static_cast<size_t>(kind_index_[layer]);
    if (shape_.IsSliding(layer)) {
      return window_arena +
             (static_cast<size_t>(window_block) * n_sliding_ + index) * layer_slice_bytes_;
    }
    return (static_cast<size_t>(block) * n_global_ + index) * layer_slice_bytes_;
  }
  // Offset of layer `layer` of `block` here; a sliding layer needs HasWindow(block).
  size_t LayerSliceOffset(int32_t block, int layer) const {
    const int32_t w = shape_.IsSliding(layer) ? CheckedWindow(block) : -1;
    return SliceOffsetIn(WindowArenaOffset(), block, w, layer);
  }

  // (head_dim, block_tokens) fp16 keys of one kv head in one block and layer: element
  // [d * block_tokens + slot]. A sliding layer needs HasWindow(block).
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
  // holders). Allocate is all-or-nothing and gives blocks without window storage; freeing a
  // block (its last Release) frees its window block too.
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

  // Window storage. Every call is a no-op (or trivially true) without sliding layers.
  // `table` is a sequence's block table in position order (block_tokens positions per block).
  //
  // The first block a query at position `pos` reads in a sliding layer.
  int WindowStartBlock(int64_t pos) const;
  // Lends window blocks to the blocks of `table` covering positions [first_pos, end_pos) that
  // have none (about to be written). All or nothing: ResourceExhausted when too few are free.
  Status AttachWindow(std::span<const int32_t> table, int64_t first_pos, int64_t end_pos);
  // How many window blocks AttachWindow(table, first_pos, end_pos) would lend.
  int MissingWindows(std::span<const int32_t> table, int64_t first_pos, int64_t end_pos) const;
  // Takes back the window blocks of the blocks of `table` that lie wholly before the window of
  // a query at next_pos, where `table` is their only active holder: a block's references less
  // passive_refs(block) (holders that read no window, e.g. the prefix cache; null: none) must
  // be 1. A block another sequence shares keeps its window until freed or DropWindow.
  // Returns how many were taken back.
  int TrimWindow(std::span<const int32_t> table, int64_t next_pos,
                 const std::function<int(int32_t)>& passive_refs = nullptr);
  // Takes back one block's window block, whoever holds it (the prefix cache makes room).
  void DropWindow(int32_t block);
  // The longest prefix, at most n_blocks blocks of `table`, from whose end a sequence can
  // resume: the window behind position n * block_tokens is stored.
  int ResumablePrefix(std::span<const int32_t> table, int n_blocks) const;
  // OK when every sliding layer can be written at [first_pos, end_pos) and read from the
  // window of first_pos on; FailedPrecondition otherwise.
  Status CheckWindow(std::span<const int32_t> table, int64_t first_pos, int64_t end_pos) const;
  bool HasWindow(int32_t block) const { return window_of_[block] >= 0; }
  int32_t window_block(int32_t block) const { return window_of_[block]; }
  int num_window_blocks() const { return shape_.num_window_blocks; }
  int num_free_window() const { return static_cast<int>(free_window_.size()); }

 private:
  explicit PagedKvCache(const KvCacheShape& shape);
  int32_t CheckedWindow(int32_t block) const;

  KvCacheShape shape_;
  size_t layer_slice_bytes_;
  int n_global_ = 0;
  int n_sliding_ = 0;
  std::vector<int> kind_index_;  // per layer: its index among the layers of its kind
  std::unique_ptr<uint8_t, KvMemoryDeleter> data_;
  std::vector<int32_t> free_;         // stack of free block ids
  std::vector<int32_t> refs_;         // per block
  std::vector<int32_t> window_of_;    // per block: its window block, or -1
  std::vector<int32_t> free_window_;  // stack of free window blocks
};

}  // namespace tandem::engine
