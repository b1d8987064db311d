// SiluMul on AVX-512 (this file is compiled with the AVX-512 flags; reached only through the
// avx512 table).
#include <immintrin.h>

#include "kernels/exp_avx512_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {

void SiluMulAvx512(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  SiluMulScalar(gate + i, up + i, n - i);
}

// Table lookups by gather: the index is the fp16 bit pattern of x (round to nearest even, as
// the scalar Fp32ToFp16).
void GeluMulAvx512(float* gate, const float* up, int64_t n) {
  const float* table = GeluTable();
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 g = _mm512_i32gather_ps(_mm512_cvtepu16_epi32(h), table, 4);
    g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), g, x);
    g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ), g);
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(g, _mm512_loadu_ps(up + i)));
  }
  GeluMulScalar(gate + i, up + i, n - i);
}

void RoundToFp16Avx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h =
        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(x + i, _mm512_cvtph_ps(h));
  }
  RoundToFp16Scalar(x + i, n - i);
}

double ExpSumAvx512(const float* x, float shift, float scale, float* out, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift), k = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s), k);
    // Below exp's range (masked logits are -inf): exactly 0, never a tiny chance.
    const __m512 e =
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_set1_ps(-87.3f), _CMP_GE_OQ), Exp16(y));
    _mm512_storeu_ps(out + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum + ExpSumScalar(x + i, shift, scale, out + i, n - i);
}

}  // namespace tandem::kernels::internal
