// Causal attention of a tile of query tokens over paged fp16 K/V (fp32 math), for one KV head
// and its group of query heads. The KV layout is the engine's (engine/kv_cache.h); this kernel
// sees only per-block pointers, so it knows nothing of caches or sequences.
//
// Flash-attention style: key/value blocks are streamed once per tile of query tokens with an
// online softmax, so scratch does not grow with the context and each block is converted from
// fp16 once per tile rather than once per query.
#pragma once

#include <climits>
#include <cstdint>

namespace tandem::kernels {

constexpr int kMaxAttentionTile = 64;   // query tokens per call
constexpr int kMaxAttentionGroup = 16;  // query heads per KV head
constexpr int kMaxAttentionHeadDim = 256;
// Key ranges (AttentionTile::key_begin / key_end) are multiples of this many positions.
constexpr int kAttentionChunkAlign = 32;

// Online-softmax state of one query row (one token, one query head) over the keys seen so far:
// the largest scaled score, and the sum of exp(score - max). {-inf, 0}: no key seen.
struct AttentionRowState {
  float max;
  float sum;
};

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
  // Only keys at positions [key_begin, key_end) are seen: one chunk of the context, so that
  // chunks can run on different threads and be folded (FoldAttentionPartial). Multiples of
  // kAttentionChunkAlign; blocks outside the range are not read.
  int key_begin = 0;
  int key_end = INT_MAX;
  // Null: out gets the normalized attention output. Otherwise the unnormalized partial result
  // instead: out gets acc = sum over seen keys of exp(score - max) * V, and partial[t * group +
  // gi] the row's state ({-inf, 0} and acc 0 for a row that sees no key of the range).
  AttentionRowState* partial = nullptr;
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
// First key position a query at `pos` sees in this call (its window's, within the key range).
inline int RowKeyStart(const AttentionTile& a, int pos) {
  const int w = WindowStart(a, pos);
  return w > a.key_begin ? w : a.key_begin;
}
// The last key position a tile whose last query is at last_pos sees in this call.
inline int LastKey(const AttentionTile& a, int last_pos) {
  return last_pos < a.key_end - 1 ? last_pos : a.key_end - 1;
}
// The first block index (position / block_tokens) a tile starting at first_pos reads.
inline int FirstVisibleBlock(const AttentionTile& a, int first_pos) {
  return RowKeyStart(a, first_pos) / a.block_tokens;
}

void AttendTile(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                int64_t q_stride, float* out, int64_t out_stride);

// Folds the partial result of the next key range (acc: rows x head_dim, st: rows) into a running
// one (run_acc, run_st; start from acc 0 and {-inf, 0}). Ranges must be folded in position order:
// the fold fixes the summation order, so that a query's output does not depend on how its ranges
// were spread over threads. A fold with an empty side copies the other exactly.
void FoldAttentionPartial(int rows, int head_dim, const float* acc, const AttentionRowState* st,
                          float* run_acc, AttentionRowState* run_st);

// out row r (out + (r / group) * out_stride + (r % group) * head_dim) = acc row r / sum, computed
// as the kernels normalize (acc * (1 / sum)), so a query whose keys all fell in one range gets
// exactly the output of a call without key ranges.
void NormalizeAttentionRows(int rows, int group, int head_dim, const float* acc,
                            const AttentionRowState* st, float* out, int64_t out_stride);

}  // namespace tandem::kernels
