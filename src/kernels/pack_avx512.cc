// Weight-row packing for the AVX-512 path (layout in avx512_layout_internal.h). Compiled with the
// AVX-512 flags.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512_layout_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal::avx512 {
namespace {

inline __m512i Load(const void* p) { return _mm512_loadu_si512(p); }

// Stores halves A/B of group g and the lane scales.
void StoreGroup(uint8_t* dst, const QLayout& L, int64_t g, __m512i a, __m512i b, __m512 sw) {
  _mm512_storeu_si512(dst + g * 128, a);
  _mm512_storeu_si512(dst + g * 128 + 64, b);
  _mm512_storeu_ps(dst + L.w_sw() + g * 64, sw);
}

// Q4_0 / Q4_1 / Q5_0 / Q8_0 in kSplit order: no permutes. mw: Q4_1 m, Q4_0 -8 d, Q5_0 -16 d,
// Q8_0 -128 d.
template <DType kType>
void PackSplit(const uint8_t* src, int64_t k, const QLayout& L, uint8_t* dst) {
  const int64_t nb = k / 32;
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  std::memset(mw, 0, L.nmin16 * sizeof(float));
  // Odd elements of f (the mins) for Q4_1, even ones (d) otherwise, times the offset.
  const __m256i pick = kType == DType::kQ4_1 ? _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)
                                             : _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const float mul = kType == DType::kQ4_1   ? 1.f
                    : kType == DType::kQ4_0 ? -8.f
                    : kType == DType::kQ5_0 ? -16.f
                                            : -128.f;
  for (int64_t g = 0; g < L.groups; ++g) {
    SplitGroup s;
    if constexpr (kType == DType::kQ5_0) {
      s = LoadQ5_0Group(src, g, nb);
    } else {
      s = LoadSplitGroup<kType>(src, g, nb);
    }
    StoreGroup(dst, L, g, s.a, s.b, Expand4Even(s.f));
    const __m256 m = _mm256_mul_ps(_mm256_permutevar8x32_ps(s.f, pick), _mm256_set1_ps(mul));
    _mm_storeu_ps(mw + 4 * g, _mm256_castps256_ps128(m));
  }
}

void PackQ4_K(const uint8_t* src, int64_t k, const QLayout& L, uint8_t* dst) {
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  std::memset(mw, 0, L.nmin16 * sizeof(float));
  const __m512i idx_a = Load(kIdxQ4K[0].data()), idx_b = Load(kIdxQ4K[1].data());
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < k / 256; ++sb) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(src + sb * sizeof(BlockQ4_K));
    // The 8 six-bit scales and mins (GetScaleMinK4), four bytes at a time.
    uint32_t u[3];
    std::memcpy(u, blk->scales, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0)));
    const __m256 mn = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_setr_epi32(static_cast<int>(m_lo), static_cast<int>(m_hi), 0, 0)));
    const __m256 scale = _mm256_mul_ps(sc, _mm256_set1_ps(_cvtsh_ss(blk->d)));
    _mm256_storeu_ps(mw + 8 * sb, _mm256_mul_ps(mn, _mm256_set1_ps(-_cvtsh_ss(blk->dmin))));
    for (int h = 0; h < 2; ++h) {
      const __m512i v = Load(blk->qs + 64 * h);
      const __m512i lo = _mm512_and_si512(v, m4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      const __m128 s4 = h == 0 ? _mm256_castps256_ps128(scale) : _mm256_extractf128_ps(scale, 1);
      StoreGroup(dst, L, 2 * sb + h, _mm512_permutex2var_epi32(lo, idx_a, hi),
                 _mm512_permutex2var_epi32(lo, idx_b, hi), Expand4(s4));
    }
  }
}

// Q6_K: unsigned q (0..63) in kLanes order; the -32 offset goes to mw per 16 elements.
void PackQ6_K(const uint8_t* src, int64_t k, const QLayout& L, uint8_t* dst) {
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  std::memset(mw, 0, L.nmin16 * sizeof(float));
  const __m512i idx_a = Load(kIdxLanes[0].data()), idx_b = Load(kIdxLanes[1].data());
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  for (int64_t sb = 0; sb < k / 256; ++sb) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(src + sb * sizeof(BlockQ6_K));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(blk->d));
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = Load(blk->ql + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      // [qh, qh >> 2]: bits 0-1 are the high bits of elements 0..31 | 32..63;
      // shifted by 4 more: elements 64..95 | 96..127.
      const __m512i hx =
          _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      const __m512i h_lo = _mm512_slli_epi16(_mm512_and_si512(hx, m3), 4);
      const __m512i h_hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hx, 4), m3), 4);
      const __m512i n0 = _mm512_or_si512(_mm512_and_si512(ql, m4), h_lo);
      const __m512i n1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h_hi);
      const __m128i sc8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->scales + 8 * h));
      const __m256 scale = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), d);
      _mm256_storeu_ps(mw + 16 * sb + 8 * h, _mm256_mul_ps(scale, _mm256_set1_ps(-32.f)));
      StoreGroup(dst, L, 2 * sb + h, _mm512_permutex2var_epi32(n0, idx_a, n1),
                 _mm512_permutex2var_epi32(n0, idx_b, n1), Expand8(scale));
    }
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
    case DType::kQ4_0: PackSplit<DType::kQ4_0>(src, k, L, dst); return;
    case DType::kQ4_1: PackSplit<DType::kQ4_1>(src, k, L, dst); return;
    case DType::kQ5_0: PackSplit<DType::kQ5_0>(src, k, L, dst); return;
    case DType::kQ8_0: PackSplit<DType::kQ8_0>(src, k, L, dst); return;
    case DType::kQ4_K: PackQ4_K(src, k, L, dst); return;
    case DType::kQ6_K: PackQ6_K(src, k, L, dst); return;
    default: PackFloat(t, src, k, L, dst); return;
  }
}

}  // namespace tandem::kernels::internal::avx512
