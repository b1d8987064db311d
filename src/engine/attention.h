// Causal attention of query tokens over a sequence's paged KV cache (fp16 K/V, fp32 math).
#pragma once

#include <cstdint>
#include <span>

#include "engine/kv_cache.h"

namespace tandem::engine {

struct AttentionArgs {
  PagedKvCache* kv;
  int layer;
  std::span<const int32_t> block_table;  // the sequence's blocks, in position order
  int n_heads;                           // query heads; n_heads % n_kv_heads == 0
  float scale;                           // usually 1/sqrt(head_dim)
};

// For one query token at position `pos`, attends over positions [0, pos] of the sequence, for
// the query heads sharing kv head `kv_head`.
//   q:   (n_heads, head_dim) fp32, the token's rotated queries
//   out: (n_heads, head_dim) fp32; only the heads of this kv group are written
// Two passes: all scores, then softmax and the weighted sum of values. Numerics follow
// llama.cpp's CPU path (queries and probabilities rounded to fp16 before their products with
// the fp16 cache) so that logits agree closely; scratch is a thread-local (g, context) buffer.
void AttendOneToken(const AttentionArgs& args, int pos, int kv_head, const float* q, float* out);

// Selects the AVX2 path when the CPU has it ("avx2") or forces the portable one ("scalar").
void SetAttentionIsa(const char* isa);

}  // namespace tandem::engine
