#include "engine/activations.h"

#include <immintrin.h>

#include <cmath>

#include "engine/simd_exp.h"

namespace tandem::engine {
namespace {

__attribute__((target("avx512f"))) void SiluMulAvx512(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = internal::Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  SiluMulScalar(gate + i, up + i, n - i);
}

const bool kHasAvx512 = __builtin_cpu_supports("avx512f");

}  // namespace

void SiluMulScalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void SiluMul(float* gate, const float* up, int64_t n) {
  if (kHasAvx512) {
    SiluMulAvx512(gate, up, n);
  } else {
    SiluMulScalar(gate, up, n);
  }
}

}  // namespace tandem::engine
