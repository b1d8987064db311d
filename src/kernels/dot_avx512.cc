// AVX-512 (F/BW/VL/DQ + VNNI) MatMul. Compiled with -mavx512* flags: only reached after the
// runtime CPU check in matmul.cc.
//
// Activations are quantized once into int8 with per-lane float scales (layout in
// avx512_layout_internal.h). Weights are unpacked, 4 rows at a time, into a tile of unsigned 8-bit
// integers in the matching layout; the 4 x C microkernel then needs two vpdpbusd, one convert,
// one multiply and one FMA per (weight row, activation row, 128 elements), whatever the type.
// Every activation row takes this same path, whatever m is, so an output row is bit-identical
// whether it was computed alone (decode) or in a batch: batching never changes results.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512_layout_internal.h"
#include "kernels/gemm_driver_internal.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal {
namespace avx512 {
namespace {

inline __m512i Load(const void* p) { return _mm512_loadu_si512(p); }
inline void Store(void* p, __m512i v) { _mm512_storeu_si512(p, v); }

// ---- activations ----

// Q8_0 / Q8_1 numerics (quant_blocks_internal.h) in kSplit order, for Q4_0 / Q4_1 / Q5_0 / Q8_0
// weights.
// ss per 32: Q4_1 (ggml's Q8_1 s) fp16(d * sum q); others fp16(d) * sum q. Values are
// assembled in registers: a narrow store read back by a wide load stalls on store forwarding.
void QuantActSplit(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  const QLayout L(k, wtype);
  const int64_t nb = k / 32;
  auto* sa = reinterpret_cast<float*>(dst + L.act_sa());
  auto* ss = reinterpret_cast<float*>(dst + L.act_ss());
  std::memset(ss, 0, L.nmin16 * sizeof(float));
  for (int64_t g = 0; g < L.groups; ++g) {
    __m128i part[8];
    float dv[4], sv[4];
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      const int64_t blk = 4 * g + b;
      if (blk >= nb) {
        part[2 * b] = part[2 * b + 1] = _mm_setzero_si128();
        dv[b] = sv[b] = 0;
        continue;
      }
      const Q8Block q = QuantizeQ8Block(x + 32 * blk);
      part[2 * b] = q.lo;
      part[2 * b + 1] = q.hi;
      dv[b] = RoundHalf(q.d);
      const auto sum = static_cast<float>(q.sum);
      sv[b] = wtype == DType::kQ4_1 ? RoundHalf(q.d * sum) : dv[b] * sum;
    }
    Store(dst + g * 128, Combine(part[0], part[2], part[4], part[6]));
    Store(dst + g * 128 + 64, Combine(part[1], part[3], part[5], part[7]));
    _mm512_storeu_ps(sa + 16 * g, Expand4(_mm_setr_ps(dv[0], dv[1], dv[2], dv[3])));
    _mm_storeu_ps(ss + 4 * g, _mm_setr_ps(sv[0], sv[1], sv[2], sv[3]));
  }
}

// Q8_K numerics (quant_blocks_internal.h) in kLanes order. ss = d * sum q per 32 (Q4_K) or 16
// (Q6_K).
void QuantActQ8K(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  const QLayout L(k, wtype);
  auto* sa = reinterpret_cast<float*>(dst + L.act_sa());
  auto* ss = reinterpret_cast<float*>(dst + L.act_ss());
  std::memset(ss, 0, L.nmin16 * sizeof(float));
  const __m512i idx_a = Load(kIdxLanes[0].data()), idx_b = Load(kIdxLanes[1].data());
  for (int64_t sb = 0; sb < k / 256; ++sb) {
    const float* xs = x + 256 * sb;
    __m128i part[16];
    int bsum[16] = {};
    float d = 0;
    __m512 vmax = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i)
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(xs + 16 * i)));
    const float amax = _mm512_reduce_max_ps(vmax);
    if (amax == 0) {
      for (auto& p : part) p = _mm_setzero_si128();
    } else {
      float max = 0;
      for (int i = 0; i < 16; ++i) {  // the first element of largest magnitude, as ggml
        const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xs + 16 * i)),
                                                 _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
          max = xs[16 * i + __builtin_ctz(hit)];
          break;
        }
      }
      const float iscale = -127.f / max;
      d = 1 / iscale;
      const __m512 vis = _mm512_set1_ps(iscale);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const __m512i q = _mm512_min_epi32(Rne(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * i), vis)),
                                           _mm512_set1_epi32(127));
        part[i] = _mm512_cvtepi32_epi8(q);
        bsum[i] = _mm512_reduce_add_epi32(q);
      }
    }
    if (wtype == DType::kQ6_K) {
      for (int j = 0; j < 16; ++j) ss[16 * sb + j] = d * static_cast<float>(bsum[j]);
    } else {
      for (int j = 0; j < 8; ++j)
        ss[8 * sb + j] = d * static_cast<float>(bsum[2 * j] + bsum[2 * j + 1]);
    }
    for (int h = 0; h < 2; ++h) {
      const __m128i* p = part + 8 * h;
      const __m512i n0 = Combine(p[0], p[1], p[2], p[3]), n1 = Combine(p[4], p[5], p[6], p[7]);
      const int64_t g = 2 * sb + h;
      Store(dst + g * 128, _mm512_permutex2var_epi32(n0, idx_a, n1));
      Store(dst + g * 128 + 64, _mm512_permutex2var_epi32(n0, idx_b, n1));
      _mm512_storeu_ps(sa + 16 * g, _mm512_set1_ps(d));
    }
  }
}

// Float activations, rounded through fp16 / bf16 when the weights are of that type.
void ConvertActF(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  auto* out = reinterpret_cast<float*>(dst);
  for (int64_t i = 0; i < RoundUp(k, 16); i += 16) {
    const __mmask16 m = i + 16 <= k ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    if (wtype == DType::kF16) {
      v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (wtype == DType::kBF16) {  // round to nearest even; NaN stays NaN
      const __m512i bits = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
      const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      r = _mm512_mask_or_epi32(r, nan, bits, _mm512_set1_epi32(0x00400000));
      v = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000))));
    }
    _mm512_storeu_ps(out + i, v);
  }
}

int64_t ActRowBytes(DType wtype, int64_t k) {
  if (IsFloat(wtype)) return RoundUp(k, 16) * 4;
  return QLayout(k, wtype).act_bytes();
}

void QuantizeAct(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  switch (wtype) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ8_0: QuantActSplit(wtype, x, k, dst); return;
    case DType::kQ4_K:
    case DType::kQ6_K: QuantActQ8K(wtype, x, k, dst); return;
    default: ConvertActF(wtype, x, k, dst); return;
  }
}

// ---- microkernels ----

// [sum a, sum b, sum c, sum d].
inline __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Stores the first nr of 4 consecutive outputs.
inline void Store4(float* y, __m128 v, int nr) {
  if (nr == 4) {
    _mm_storeu_ps(y, v);
  } else {
    alignas(16) float t[4];
    _mm_store_ps(t, v);
    for (int r = 0; r < nr; ++r) y[r] = t[r];
  }
}

// Sum over each int32 lane of the products of unsigned w and signed a bytes, halves A and B.
inline __m512i DotPair(__m512i w_a, __m512i w_b, __m512i a_a, __m512i a_b) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w_a, a_a), w_b, a_b);
}

// Weight groups read back from a packed tile (PackRow's layout), 4 rows wstride apart.
struct TileGroups {
  const uint8_t* tile;
  int64_t wstride;
  const QLayout& L;
  GroupRegs Group(int r, int64_t g) const {
    const uint8_t* w = tile + r * wstride;
    return {Load(w + g * 128), Load(w + g * 128 + 64), _mm512_loadu_ps(w + L.w_sw() + g * 64)};
  }
  const float* Mw(int r) const {
    return reinterpret_cast<const float*>(tile + r * wstride + L.w_mw());
  }
};

// How far ahead of the rows being read Direct prefetches (bytes, rounded to whole rows).
constexpr int64_t kDirectPrefetchBytes = 8 << 10;

// Weight groups built in registers from 4 GGUF rows as they are used (Reader), their additive
// terms collected in mw (4 x nmin16 floats, zero past the groups). Each group read also
// prefetches into L2 the bytes at the same place prefetch_offset further on (group_bytes per
// group), so that the requests for the rows ahead go out evenly over the computation: a burst
// of a whole tile's lines at once fills the core's miss buffers and stalls on them.
template <typename Reader>
struct RowGroups {
  const Reader& reader;
  const uint8_t* const* rows;
  float* mw;
  int64_t nmin16;
  int64_t prefetch_offset;
  int64_t group_bytes;
  GroupRegs Group(int r, int64_t g) const {
    const char* ahead = reinterpret_cast<const char*>(rows[r] + prefetch_offset + g * group_bytes);
    for (int64_t off = 0; off < group_bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
    return reader.Read(rows[r], g, mw + r * nmin16);
  }
  const float* Mw(int r) const { return mw + r * nmin16; }
};

// 4 weight rows x C activation rows, quantized types; the weights come from Groups (a packed
// tile or the GGUF rows). One body for both sources, so an output is bit-identical whichever
// path computed it.
template <int C, typename Groups>
void QDot(const Groups& w, const uint8_t* act, int64_t astride, const QLayout& L, float* y,
          int64_t ldy, int nr) {
  __m512 acc[4][C];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < L.groups; ++g) {
    __m512i a_a[C], a_b[C];
    __m512 sa[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* a = act + c * astride;
      a_a[c] = Load(a + g * 128);
      a_b[c] = Load(a + g * 128 + 64);
      sa[c] = _mm512_loadu_ps(a + L.act_sa() + g * 64);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const GroupRegs q = w.Group(r, g);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m512i s = DotPair(q.a, q.b, a_a[c], a_b[c]);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(q.sw, sa[c]), acc[r][c]);
      }
    }
  }
  for (int64_t b = 0; b < L.nmin16; b += 16) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512 s = _mm512_loadu_ps(act + c * astride + L.act_ss() + 4 * b);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(w.Mw(r) + b), s, acc[r][c]);
    }
  }
  for (int c = 0; c < C; ++c)
    Store4(y + c * ldy, Reduce4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]), nr);
}

// 4 packed weight rows x C activation rows, quantized types.
template <int C>
void QKernel(const uint8_t* wt, int64_t wstride, const uint8_t* act, int64_t astride,
             const QLayout& L, float* y, int64_t ldy, int nr) {
  QDot<C>(TileGroups{wt, wstride, L}, act, astride, L, y, ldy, nr);
}

// 4 packed weight rows x C activation rows, float types.
template <int C>
void FKernel(const uint8_t* wt, int64_t wstride, const uint8_t* act, int64_t astride,
             const QLayout& L, float* y, int64_t ldy, int nr) {
  __m512 acc[4][C];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < L.k16; i += 16) {
    __m512 a[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      a[c] = _mm512_loadu_ps(reinterpret_cast<const float*>(act + c * astride) + i);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512 w = _mm512_loadu_ps(reinterpret_cast<const float*>(wt + r * wstride) + i);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(w, a[c], acc[r][c]);
    }
  }
  for (int c = 0; c < C; ++c)
    Store4(y + c * ldy, Reduce4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]), nr);
}

// PackRow + QKernel<C> for C <= 4 activation rows without the tile: each weight group is built
// in registers (Reader) and used at once (with so few activation rows a tile would be read back
// only once). QDot does the arithmetic, so outputs are bit-identical to the tiled path's and
// batch invariance does not depend on which path ran.
template <typename Reader, int C>
void Direct(const WeightView& w, const uint8_t* act, int64_t astride, const QLayout& L, int64_t r0,
            int64_t r1, float* y, int64_t ldy) {
  const int64_t row_bytes = RowBytes(w.dtype, w.cols);
  const Reader reader{w.cols / 32};
  const auto* src = static_cast<const uint8_t*>(w.data);
  auto* mw = reinterpret_cast<float*>(ThreadScratch(1, 4 * L.nmin16 * sizeof(float)));
  std::memset(mw, 0, 4 * L.nmin16 * sizeof(float));
  // Prefetches go past r1 near the end of the range (into rows another call reads): harmless,
  // a prefetch never faults.
  const int64_t prefetch_offset =
      std::max<int64_t>(kTileRows, kDirectPrefetchBytes / row_bytes) * row_bytes;
  const int64_t group_bytes = (row_bytes + L.groups - 1) / L.groups;
  for (int64_t rr = r0; rr < r1; rr += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - rr));
    const uint8_t* rows[4];
    for (int r = 0; r < 4; ++r) rows[r] = src + (rr + std::min(r, nr - 1)) * row_bytes;
    const RowGroups<Reader> groups{reader, rows, mw, L.nmin16, prefetch_offset, group_bytes};
    QDot<C>(groups, act, astride, L, y + rr, ldy, nr);
  }
}

using DirectFn = void (*)(const WeightView&, const uint8_t*, int64_t, const QLayout&, int64_t,
                          int64_t, float*, int64_t);
template <typename Reader>
constexpr DirectFn kDirect[4] = {Direct<Reader, 1>, Direct<Reader, 2>, Direct<Reader, 3>,
                                 Direct<Reader, 4>};

// The direct kernel for m activation rows of weights of type t, or null where the tiled path
// runs (more rows, which reuse a packed tile; or the float types).
DirectFn PickDirect(DType t, int64_t m) {
  if (m < 1 || m > 4) return nullptr;
  switch (t) {
    case DType::kQ4_0: return kDirect<SplitReader<DType::kQ4_0>>[m - 1];
    case DType::kQ4_1: return kDirect<SplitReader<DType::kQ4_1>>[m - 1];
    case DType::kQ5_0: return kDirect<SplitReader<DType::kQ5_0>>[m - 1];
    case DType::kQ8_0: return kDirect<SplitReader<DType::kQ8_0>>[m - 1];
    case DType::kQ4_K: return kDirect<Q4KReader>[m - 1];
    case DType::kQ6_K: return kDirect<Q6KReader>[m - 1];
    default: return nullptr;
  }
}

using KernelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, const QLayout&, float*,
                          int64_t, int);
void Gemm(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m, int64_t r0,
          int64_t r1, float* y, int64_t ldy) {
  static constexpr KernelFn kQ[4] = {QKernel<1>, QKernel<2>, QKernel<3>, QKernel<4>};
  static constexpr KernelFn kF[4] = {FKernel<1>, FKernel<2>, FKernel<3>, FKernel<4>};
  const QLayout L(w.cols, w.dtype);
  if (const DirectFn direct = PickDirect(w.dtype, m)) {
    direct(w, act, act_row_bytes, L, r0, r1, y, ldy);
    return;
  }
  const bool is_float = IsFloat(w.dtype);
  const GemmParts<QLayout> parts{L, is_float ? L.k16 * 4 : L.w_bytes(), is_float ? kF : kQ,
                                 PackRow};
  TiledGemm<kTileRows, 4>(parts, w, act, act_row_bytes, m, r0, r1, y, ldy);
}

}  // namespace
}  // namespace avx512

const IsaImpl* Avx512Isa() {
  static const IsaImpl impl{
      "avx512",         avx512::ActRowBytes,     avx512::QuantizeAct, avx512::Gemm,
      SiluMulAvx512,    GeluMulAvx512,           RoundToFp16Avx512,   ExpSumAvx512,
      AttendTileAvx512, QuantizeActRows16Avx512, GemmRows16Avx512};
  return &impl;
}

}  // namespace tandem::kernels::internal
