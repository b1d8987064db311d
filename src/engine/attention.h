// Causal attention of query tokens over a sequence's paged KV cache: the engine's side of
// kernels/attention.h (which holds the math and its vector paths). This file only turns a
// block table into the kernel's per-block pointers.
#pragma once

#include <climits>
#include <cstdint>
#include <span>

#include "engine/kv_cache.h"
#include "kernels/attention.h"

namespace tandem::engine {

using kernels::kMaxAttentionTile;

struct AttentionArgs {
  PagedKvCache* kv;
  int layer;
  std::span<const int32_t> block_table;  // the sequence's blocks, in position order
  int n_heads;                           // query heads; n_heads % n_kv_heads == 0
  float scale;                           // usually 1/sqrt(head_dim)
  int window = 0;  // sliding layers: keys visible from position p are [p - window + 1, p]
  // A key range and partial output (kernels::AttentionTile's fields of the same names): only
  // keys at [key_begin, key_end) are seen, and with `partial` set, out gets the unnormalized
  // rows and partial[t * group + gi] their states, for FoldAttentionPartial.
  int key_begin = 0;
  int key_end = INT_MAX;
  kernels::AttentionRowState* partial = nullptr;
};

// Attention for `n_tokens` consecutive query tokens at positions first_pos.. (each attending to
// positions [0, its own], or its window's) and the query heads of kv head `kv_head`.
//   q:   token t's queries at q + t * q_stride, laid out (n_heads, head_dim) fp32
//   out: token t's output at out + t * out_stride, same layout; only this kv group's heads
//        are written
// n_tokens <= kMaxAttentionTile. With a window, block-table entries wholly before the first
// query's window are not read (they may be freed). Thread-safe for distinct outputs.
void AttendTile(const AttentionArgs& args, int first_pos, int n_tokens, int kv_head, const float* q,
                int64_t q_stride, float* out, int64_t out_stride);

}  // namespace tandem::engine
