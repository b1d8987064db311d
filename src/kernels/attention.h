// Causal attention of a tile of query tokens over paged fp16 K/V (fp32 math), for one KV head
// and its group of query heads. The KV layout is the engine's (engine/kv_cache.h); this kernel
// sees only per-block pointers, so it knows nothing of caches or sequences.
//
// Flash-attention style: key/value blocks are streamed once per tile of query tokens with an
// online softmax, so scratch does not grow with the context and each block is converted from
// fp16 once per tile rather than once per query.
#pragma once

#include <cstdint>

namespace tandem::kernels {

constexpr int kMaxAttentionTile = 64;   // query tokens per call
constexpr int kMaxAttentionGroup = 16;  // query heads per KV head
constexpr int kMaxAttentionHeadDim = 256;

struct AttentionTile {
  // Block b (positions [b * block_tokens, (b + 1) * block_tokens)) of this KV head:
  //   keys[b]:   (head_dim, block_tokens) fp16, element [d * block_tokens + slot]
  //   values[b]: (block_tokens, head_dim) fp16, element [slot * head_dim + d]
  // At least (first_pos + n_tokens - 1) / block_tokens + 1 blocks.
  const uint16_t* const* keys;
  const uint16_t* const* values;
  int head_dim;      // <= kMaxAttentionHeadDim
  int block_tokens;  // positions per block
  int group;         // query heads sharing this KV head, <= kMaxAttentionGroup
  float scale;       // usually 1/sqrt(head_dim)
  // > 0: sliding-window attention, a query at position p sees positions
  // [p - window + 1, p] only, and blocks wholly before the first query's window are never read
  // (their pointers may be null). 0: every position up to p.
  int window = 0;
};

// Attention for n_tokens (<= kMaxAttentionTile) consecutive query tokens at positions
// first_pos.., each attending to positions [0, its own] (or its window's).
//   q:   token t's query head g at q + t * q_stride + g * head_dim, fp32
//   out: token t's output for head g at out + t * out_stride + g * head_dim (only the group's
//        heads are written)
// The AVX-512 path takes block_tokens == 16 with head_dim % 16 == 0; other shapes, and other
// instruction sets, take the portable one. Thread-safe (scratch is per thread).
// First position a query at `pos` sees (0 without a sliding window).
inline int WindowStart(const AttentionTile& a, int pos) {
  return a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
}
// The first block index (position / block_tokens) a tile starting at first_pos reads.
inline int FirstVisibleBlock(const AttentionTile& a, int first_pos) {
  return WindowStart(a, first_pos) / a.block_tokens;
}

void AttendTile(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                int64_t q_stride, float* out, int64_t out_stride);

}  // namespace tandem::kernels
