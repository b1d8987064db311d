// AttendTile on AVX-512 (this file is compiled with the AVX-512 flags; reached only through
// the avx512 table).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/exp_avx512_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {

// AVX-512 path for block_tokens == 16 and head_dim % 16 == 0 (<= 256): one block's 16 scores
// of a query row are one register (keys stored (head_dim, 16), so score = sum_d q[d] * K[d,:]).
void AttendTileAvx512(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride) {
  if (a.block_tokens != 16 || a.head_dim % 16 != 0) {
    AttendTileScalar(a, first_pos, n_tokens, q, q_stride, out, out_stride);
    return;
  }
  const int hd = a.head_dim, g = a.group;
  const int rows = n_tokens * g;
  const int nv = hd / 16;  // vectors per head row
  // (rows, head_dim) accumulators.
  thread_local std::vector<float> acc_buf;
  acc_buf.assign(static_cast<size_t>(rows) * hd, 0.0f);
  float* acc = acc_buf.data();
  alignas(64) float kf[kMaxAttentionHeadDim * 16];
  alignas(64) float vf[16 * kMaxAttentionHeadDim];
  AttentionRowState st[kMaxAttentionRows];
  for (int r = 0; r < rows; ++r) st[r] = {-INFINITY, 0.0f};
  const __m512 scale = _mm512_set1_ps(a.scale);
  const int last_pos = first_pos + n_tokens - 1;
  const int first_block = FirstVisibleBlock(a, first_pos);
  for (int bi = first_block, start = first_block * 16; start <= last_pos; start += 16, ++bi) {
    const uint16_t* kh = a.keys[bi];
    const uint16_t* vh = a.values[bi];
    const int n_block = std::min(16, last_pos + 1 - start);
    for (int d = 0; d < hd; ++d) {
      _mm512_store_ps(
          kf + d * 16,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kh + d * 16))));
    }
    for (int i = 0; i < n_block * hd; i += 16) {
      _mm512_store_ps(
          vf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vh + i))));
    }
    for (int t = 0; t < n_tokens; ++t) {
      const int n = std::min(n_block, first_pos + t + 1 - start);  // causal
      const int j0 = std::max(0, WindowStart(a, first_pos + t) - start);
      if (n <= j0) continue;
      const __mmask16 valid = static_cast<__mmask16>(((1u << n) - 1) & ~((1u << j0) - 1));
      for (int gi = 0; gi < g; ++gi) {
        const int r = t * g + gi;
        const float* qr = q + t * q_stride + static_cast<int64_t>(gi) * hd;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 2) {
          s0 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_load_ps(kf + d * 16), s0);
          s1 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 1]), _mm512_load_ps(kf + (d + 1) * 16), s1);
        }
        const __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY),
                                              _mm512_mul_ps(_mm512_add_ps(s0, s1), scale));
        const float m = std::max(st[r].max, _mm512_reduce_max_ps(s));
        const float corr = std::exp(st[r].max - m);
        const __m512 p = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(m))));
        st[r] = {m, st[r].sum * corr + _mm512_reduce_add_ps(p)};
        alignas(64) float pj[16];
        _mm512_store_ps(pj, p);
        float* ar = acc + r * hd;
        for (int v = 0; v < nv; ++v) {
          __m512 av = _mm512_mul_ps(_mm512_loadu_ps(ar + 16 * v), _mm512_set1_ps(corr));
          for (int j = j0; j < n; ++j) {
            av = _mm512_fmadd_ps(_mm512_set1_ps(pj[j]), _mm512_load_ps(vf + j * hd + 16 * v), av);
          }
          _mm512_storeu_ps(ar + 16 * v, av);
        }
      }
    }
  }
  for (int t = 0; t < n_tokens; ++t) {
    for (int gi = 0; gi < g; ++gi) {
      const int r = t * g + gi;
      float* o = out + t * out_stride + static_cast<int64_t>(gi) * hd;
      const __m512 inv = _mm512_set1_ps(1.0f / st[r].sum);
      for (int v = 0; v < nv; ++v) {
        _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + 16 * v), inv));
      }
    }
  }
}

}  // namespace tandem::kernels::internal
