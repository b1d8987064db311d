// Internal header (kernels only). What the AVX-512 attention kernels (attention_avx512.cc,
// attention_amx.cc) share: include only from translation units built with the AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {

// out row (t, head gi) = acc row (t * group + gi) / its softmax sum, for n_tokens tokens.
//   acc: (n_tokens * group, head_dim) fp32; st: the rows' final online-softmax states.
//   out: token t's head gi at out + t * out_stride + gi * head_dim; head_dim % 16 == 0.
inline void StoreNormalizedRows(const float* acc, const AttentionRowState* st, int n_tokens,
                                int group, int head_dim, float* out, int64_t out_stride) {
  for (int t = 0; t < n_tokens; ++t) {
    for (int gi = 0; gi < group; ++gi) {
      const int64_t r = static_cast<int64_t>(t) * group + gi;
      float* o = out + t * out_stride + static_cast<int64_t>(gi) * head_dim;
      const __m512 inv = _mm512_set1_ps(1.0f / st[r].sum);
      for (int d = 0; d < head_dim; d += 16) {
        _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(acc + r * head_dim + d), inv));
      }
    }
  }
}

}  // namespace tandem::kernels::internal
