#include "engine/activations.h"

#include <immintrin.h>

#include <cmath>

namespace tandem::engine {
namespace {

// exp(x) for 16 floats: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by
// exponent arithmetic. Inputs are clamped to [-87.3, 88.7] (the float range).
__attribute__((target("avx512f"))) __m512 Exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) void SiluMulAvx512(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
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
