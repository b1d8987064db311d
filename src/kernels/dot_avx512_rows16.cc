// AVX-512 VNNI MatMul on interleaved ("rows16") weights: layout in kernels/interleaved.h, the
// activation row and the arithmetic every path shares in interleaved_internal.h. Compiled with
// the AVX-512 flags; reached only through the avx512 / amx ISA tables.
//
// One 64-byte load holds 4 quant bytes of each of a panel's 16 rows, so int32 lane r of every
// vpdpbusd belongs to row r and takes its 4 activation bytes as one broadcast dword. Per block
// column (16 rows x 32 elements) and activation row: 8 vpdpbusd (Q4_1 after an and / shift+and
// per 64 bytes, Q8_0 after an xor), one convert, one multiply, one or two FMAs. No tile is
// packed and no lanes are reduced, and every batch size runs this same body: outputs do not
// depend on the batch.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512_layout_internal.h"
#include "kernels/gemm_driver_internal.h"
#include "kernels/interleaved.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kMaxCols = 4;                  // activation rows per kernel call
constexpr int64_t kPrefetchBytes = 8 << 10;  // how far ahead the weights are prefetched (L2)

inline __m512i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// out[c][0..15] = the panel's 16 rows dotted with activation row c (C rows, astride apart).
// prefetch: also prefetch the bytes kPrefetchBytes past each block column (into L2), for the
// first pass over a panel whose weights come from memory.
template <DType kType, int C>
void PanelDot(const uint8_t* panel, int64_t nb, const uint8_t* act, int64_t astride, bool prefetch,
              __m512* out) {
  constexpr bool kQ41 = kType == DType::kQ4_1;
  constexpr int64_t kColBytes = kQ41 ? 320 : 544;
  constexpr int kHead = kQ41 ? 64 : 32;
  const Rows16ActLayout L(nb * 32);
  __m512 acc[C], macc[C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = panel + b * kColBytes;
    if (prefetch) {
#pragma GCC unroll 9
      for (int64_t off = 0; off < kColBytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + off), _MM_HINT_T1);
      }
    }
    // Two independent integer chains per activation row (halve the vpdpbusd latency chain).
    __m512i i0[C], i1[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) i0[c] = i1[c] = _mm512_setzero_si512();
    if constexpr (kQ41) {
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const __m512i v = _mm512_loadu_si512(blk + kHead + 64 * s);
        const __m512i lo = _mm512_and_si512(v, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const auto* qa = reinterpret_cast<const int8_t*>(act + c * astride) + 32 * b;
          i0[c] = _mm512_dpbusd_epi32(i0[c], lo, Bcast(qa + 4 * s));
          i1[c] = _mm512_dpbusd_epi32(i1[c], hi, Bcast(qa + 16 + 4 * s));
        }
      }
    } else {
#pragma GCC unroll 8
      for (int s = 0; s < 8; s += 2) {
        const __m512i v0 = _mm512_xor_si512(_mm512_loadu_si512(blk + kHead + 64 * s), bias);
        const __m512i v1 = _mm512_xor_si512(_mm512_loadu_si512(blk + kHead + 64 * s + 64), bias);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const auto* qa = reinterpret_cast<const int8_t*>(act + c * astride) + 32 * b;
          i0[c] = _mm512_dpbusd_epi32(i0[c], v0, Bcast(qa + 4 * s));
          i1[c] = _mm512_dpbusd_epi32(i1[c], v1, Bcast(qa + 4 * s + 4));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* a = act + c * astride;
      __m512i isum = _mm512_add_epi32(i0[c], i1[c]);
      if constexpr (!kQ41) {
        isum = _mm512_sub_epi32(
            isum, _mm512_set1_epi32(reinterpret_cast<const int32_t*>(a + L.corr())[b]));
      }
      const __m512 scale =
          _mm512_mul_ps(dw, _mm512_set1_ps(reinterpret_cast<const float*>(a + L.da())[b]));
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[c]);
    }
    if constexpr (kQ41) {
      const __m512 mw =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const float sa = reinterpret_cast<const float*>(act + c * astride + L.sa())[b];
        macc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa), macc[c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) out[c] = kQ41 ? _mm512_add_ps(acc[c], macc[c]) : acc[c];
}

using PanelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, bool, __m512*);
template <DType kType>
constexpr PanelFn kPanel[kMaxCols] = {PanelDot<kType, 1>, PanelDot<kType, 2>, PanelDot<kType, 3>,
                                      PanelDot<kType, 4>};

}  // namespace

// The Q8_0 / Q8_1 activation quantizers' numerics (quant_blocks_internal.h), natural order.
void QuantizeActRows16Avx512(const float* x, int64_t k, uint8_t* dst) {
  const Rows16ActLayout L(k);
  auto* da = reinterpret_cast<float*>(dst + L.da());
  auto* sa = reinterpret_cast<float*>(dst + L.sa());
  auto* corr = reinterpret_cast<int32_t*>(dst + L.corr());
  for (int64_t b = 0; b < L.nb; ++b) {
    const avx512::Q8Block q = avx512::QuantizeQ8Block(x + 32 * b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32 * b), q.lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32 * b + 16), q.hi);
    da[b] = avx512::RoundHalf(q.d);
    sa[b] = avx512::RoundHalf(q.d * static_cast<float>(q.sum));
    corr[b] = 128 * q.sum;
  }
  std::memset(dst + L.nb * 44, 0, L.bytes() - L.nb * 44);
}

// IsaImpl::gemm's contract for rows16 weights. Rows outside [r0, r1) of a panel that straddles
// the range are computed and dropped (masked stores), so any range works.
void GemmRows16Avx512(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
                      int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t nb = w.cols / 32;
  const int64_t panel_bytes = nb * Rows16BlockBytes(w.dtype);
  const PanelFn* kernels = w.dtype == DType::kQ4_1 ? kPanel<DType::kQ4_1> : kPanel<DType::kQ8_0>;
  const auto* data = static_cast<const uint8_t*>(w.data);
  const int64_t chunk =
      std::max<int64_t>(kMaxCols, kActChunkBytes / act_row_bytes / kMaxCols * kMaxCols);
  for (int64_t c0 = 0; c0 < m; c0 += chunk) {
    const int64_t c1 = std::min(m, c0 + chunk);
    for (int64_t p = r0 / kInterleaveRows; p * kInterleaveRows < r1; ++p) {
      const int64_t row0 = p * kInterleaveRows;
      const int64_t lo = std::max<int64_t>(r0 - row0, 0);
      const int64_t hi = std::min<int64_t>(r1 - row0, kInterleaveRows);
      const auto keep = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
      for (int64_t c = c0; c < c1; c += kMaxCols) {
        const int nc = static_cast<int>(std::min<int64_t>(kMaxCols, c1 - c));
        __m512 out[kMaxCols];
        kernels[nc - 1](data + p * panel_bytes, nb, act + c * act_row_bytes, act_row_bytes, c == 0,
                        out);
        for (int i = 0; i < nc; ++i) _mm512_mask_storeu_ps(y + (c + i) * ldy + row0, keep, out[i]);
      }
    }
  }
}

}  // namespace tandem::kernels::internal
