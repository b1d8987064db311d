// Causal attention of query tokens over a sequence's paged KV cache (fp16 K/V, fp32 math).
//
// Flash-attention style: key/value blocks are streamed once per tile of query tokens with an
// online softmax, so scratch does not grow with the context and each cached block is converted
// from fp16 once per tile rather than once per query.
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

// Attention for `n_tokens` consecutive query tokens at positions first_pos.. (each attending to
// positions [0, its own]) and the query heads of kv head `kv_head`.
//   q:   token t's queries at q + t * q_stride, laid out (n_heads, head_dim) fp32
//   out: token t's output at out + t * out_stride, same layout; only this kv group's heads
//        are written
// n_tokens <= kMaxAttentionTile.
constexpr int kMaxAttentionTile = 16;
void AttendTile(const AttentionArgs& args, int first_pos, int n_tokens, int kv_head,
                const float* q, int64_t q_stride, float* out, int64_t out_stride);

// Selects the AVX-512 path when the CPU has it ("avx512") or forces the portable one
// ("scalar"); for tests.
void SetAttentionIsa(const char* isa);

}  // namespace tandem::engine
