// Weight-row packing for the AVX-512 path (layout in avx512_layout_internal.h). Compiled with the
// AVX-512 flags.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512_layout_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal::avx512 {
namespace {

// Every group of a quantized row from Reader, stored in tile order; mw zeroed past the groups.
template <typename Reader>
void PackGroups(const uint8_t* src, int64_t k, const QLayout& L, uint8_t* dst) {
  const Reader reader{k / 32};
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  std::memset(mw, 0, L.nmin16 * sizeof(float));
  for (int64_t g = 0; g < L.groups; ++g) {
    const GroupRegs q = reader.Read(src, g, mw);
    _mm512_storeu_si512(dst + g * 128, q.a);
    _mm512_storeu_si512(dst + g * 128 + 64, q.b);
    _mm512_storeu_ps(dst + L.w_sw() + g * 64, q.sw);
  }
}

void PackFloat(DType t, const uint8_t* src, int64_t k, const QLayout& L, uint8_t* dst) {
  auto* out = reinterpret_cast<float*>(dst);
  for (int64_t i = 0; i < L.k16; i += 16) {
    const __mmask16 m = i + 16 <= k ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 v;
    if (t == DType::kF32) {
      v = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(src) + i);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(src) + i);
      v = t == DType::kF16 ? _mm512_cvtph_ps(h)
                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    _mm512_storeu_ps(out + i, v);
  }
}

}  // namespace

void PackRow(DType t, const uint8_t* src, int64_t k, uint8_t* dst) {
  const QLayout L(k, t);
  switch (t) {
    case DType::kQ4_0: PackGroups<SplitReader<DType::kQ4_0>>(src, k, L, dst); return;
    case DType::kQ4_1: PackGroups<SplitReader<DType::kQ4_1>>(src, k, L, dst); return;
    case DType::kQ5_0: PackGroups<SplitReader<DType::kQ5_0>>(src, k, L, dst); return;
    case DType::kQ8_0: PackGroups<SplitReader<DType::kQ8_0>>(src, k, L, dst); return;
    case DType::kQ4_K: PackGroups<Q4KReader>(src, k, L, dst); return;
    case DType::kQ6_K: PackGroups<Q6KReader>(src, k, L, dst); return;
    default: PackFloat(t, src, k, L, dst); return;
  }
}

}  // namespace tandem::kernels::internal::avx512
