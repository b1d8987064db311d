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

}  // namespace tandem::kernels::internal
