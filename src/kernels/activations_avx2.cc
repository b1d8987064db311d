// SiluMul, GeluMul and RoundToFp16 on AVX2 + FMA + F16C (this file is compiled with those flags;
// reached only through the avx2 table). Same numerics as the AVX-512 versions.
#include <immintrin.h>

#include "kernels/avx2_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {

void SiluMulAvx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  SiluMulScalar(gate + i, up + i, n - i);
}

// Table lookups by gather, indexed by the fp16 bit pattern of x (round to nearest even).
void GeluMulAvx2(float* gate, const float* up, int64_t n) {
  const float* table = GeluTable();
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 g = _mm256_i32gather_ps(table, _mm256_cvtepu16_epi32(h), 4);
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));  // x >= 10: x
    g = _mm256_and_ps(g, _mm256_cmp_ps(x, lo, _CMP_GT_OQ));        // x <= -10: 0
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  GeluMulScalar(gate + i, up + i, n - i);
}

void RoundToFp16Avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  RoundToFp16Scalar(x + i, n - i);
}

double ExpSumAvx2(const float* x, float shift, float scale, float* out, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift), k = _mm256_set1_ps(scale);
  const __m256 floor = _mm256_set1_ps(-87.3f);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), s), k);
    // Below exp's range (masked logits are -inf): exactly 0, never a tiny chance.
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(y, floor, _CMP_GE_OQ), Exp8(y));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum + ExpSumScalar(x + i, shift, scale, out + i, n - i);
}

}  // namespace tandem::kernels::internal
