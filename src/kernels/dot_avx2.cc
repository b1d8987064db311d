// AVX2 + FMA + F16C MatMul. Compiled with -mavx2 -mfma -mf16c: only reached after the runtime
// CPU check in matmul.cc.
//
// Same scheme as the AVX-512 path, on 32-element blocks in natural order: weight rows are
// unpacked 4 at a time into signed 8-bit integers with 8 float lane scales per block (lane L
// covers elements 4L..4L+3, so Q6_K's 16-element scales fit), activations into int8 with one
// scale per block. maddubs needs an unsigned operand: weights that can be negative use
// |w| * sign(a, w) (|w| <= 128, so the int16 pair sums cannot saturate).
//
// Activation row: qa s8[nb*32] | sa f32[nb8] block scale | ss f32[nb8] d * sum(q) per block
// Weight row:     qw s8[nb*32] | sw f32[nb*8] lane scales | mw f32[nb8] additive term per block
// Float types: both sides are f32 rows zero-padded to k8 elements.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/fp16.h"
#include "kernels/avx2_internal.h"
#include "kernels/gemm_driver_internal.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal {
namespace avx2 {
namespace {

constexpr int kTileRows = 4;
constexpr int kMaxCols = 2;  // activation rows per microkernel call

struct Layout {
  int64_t k8, nb, nb8;
  explicit Layout(int64_t k) : k8(RoundUp(k, 8)), nb(k / 32), nb8(RoundUp(k / 32, 8)) {}
  int64_t act_sa() const { return nb * 32; }
  int64_t act_ss() const { return nb * 32 + nb8 * 4; }
  int64_t act_bytes() const { return RoundUp(nb * 32 + nb8 * 8, 64); }
  int64_t w_sw() const { return nb * 32; }
  int64_t w_mw() const { return nb * 64; }
  int64_t w_bytes() const { return RoundUp(nb * 64 + nb8 * 4, 64); }
};

bool IsFloat(DType t) { return IsFloatType(t); }

inline __m256i LoadI(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void StoreI(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline float RoundHalf(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline int HsumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
inline float Hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline __m256i Rne(__m256 v) {
  return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// Four vectors of 8 int32 (elements 0..31 in order) -> 32 int8 in order.
inline __m256i Pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// ---- activations ----

void QuantActQ8x32(const float* x, int64_t k, uint8_t* dst, bool need_sums) {
  const Layout L(k);
  auto* sa = reinterpret_cast<float*>(dst + L.act_sa());
  auto* ss = reinterpret_cast<float*>(dst + L.act_ss());
  std::memset(sa, 0, L.nb8 * 8);
  for (int64_t b = 0; b < L.nb; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    const float amax = Hmax(
        _mm256_max_ps(_mm256_max_ps(Abs(v[0]), Abs(v[1])), _mm256_max_ps(Abs(v[2]), Abs(v[3]))));
    const float d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0 ? 127.f / amax : 0.f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = Rne(_mm256_mul_ps(v[i], id));
    StoreI(dst + 32 * b, Pack32(q[0], q[1], q[2], q[3]));
    sa[b] = RoundHalf(d);
    if (need_sums) {
      const int sum =
          HsumI(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      ss[b] = RoundHalf(d * static_cast<float>(sum));
    }
  }
}

void QuantActQ8K(const float* x, int64_t k, uint8_t* dst) {
  const Layout L(k);
  auto* sa = reinterpret_cast<float*>(dst + L.act_sa());
  auto* ss = reinterpret_cast<float*>(dst + L.act_ss());
  std::memset(sa, 0, L.nb8 * 8);
  for (int64_t sb = 0; sb < k / 256; ++sb) {
    const float* xs = x + 256 * sb;
    __m256 vmax = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) vmax = _mm256_max_ps(vmax, Abs(_mm256_loadu_ps(xs + 8 * i)));
    const float amax = Hmax(vmax);
    float d = 0;
    int bsum[16] = {};
    if (amax == 0) {
      std::memset(dst + 256 * sb, 0, 256);
    } else {
      float max = 0;
      for (int i = 0; i < 32; ++i) {  // the first element of largest magnitude, as ggml
        const int hit = _mm256_movemask_ps(
            _mm256_cmp_ps(Abs(_mm256_loadu_ps(xs + 8 * i)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (hit) {
          max = xs[8 * i + __builtin_ctz(hit)];
          break;
        }
      }
      const float iscale = -127.f / max;
      d = 1 / iscale;
      const __m256 vis = _mm256_set1_ps(iscale);
      for (int c = 0; c < 8; ++c) {
        __m256i q[4];
        for (int i = 0; i < 4; ++i) {
          q[i] = _mm256_min_epi32(Rne(_mm256_mul_ps(_mm256_loadu_ps(xs + 32 * c + 8 * i), vis)),
                                  _mm256_set1_epi32(127));
        }
        bsum[2 * c] = HsumI(_mm256_add_epi32(q[0], q[1]));
        bsum[2 * c + 1] = HsumI(_mm256_add_epi32(q[2], q[3]));
        StoreI(dst + 256 * sb + 32 * c, Pack32(q[0], q[1], q[2], q[3]));
      }
    }
    for (int j = 0; j < 8; ++j) {
      sa[8 * sb + j] = d;
      ss[8 * sb + j] = d * static_cast<float>(bsum[2 * j] + bsum[2 * j + 1]);
    }
  }
}

void ConvertActF(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  auto* out = reinterpret_cast<float*>(dst);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (wtype == DType::kF16) {
      v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (wtype == DType::kBF16) {
      for (int j = 0; j < 8; ++j) out[i + j] = Bf16ToFp32(Fp32ToBf16(x[i + j]));
      continue;
    }
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < k; ++i) {
    out[i] = wtype == DType::kF16    ? Fp16ToFp32(Fp32ToFp16(x[i]))
             : wtype == DType::kBF16 ? Bf16ToFp32(Fp32ToBf16(x[i]))
                                     : x[i];
  }
  for (; i < RoundUp(k, 8); ++i) out[i] = 0;
}

int64_t ActRowBytes(DType wtype, int64_t k) {
  return IsFloat(wtype) ? RoundUp(k, 16) * 4 : Layout(k).act_bytes();
}

void QuantizeAct(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  switch (wtype) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0: QuantActQ8x32(x, k, dst, false); return;
    case DType::kQ4_1: QuantActQ8x32(x, k, dst, true); return;
    case DType::kQ4_K:
    case DType::kQ6_K: QuantActQ8K(x, k, dst); return;
    default: ConvertActF(wtype, x, k, dst); return;
  }
}

// ---- weight packing ----

template <bool kQ41>
void PackQ4(const uint8_t* src, const Layout& L, uint8_t* dst) {
  constexpr int kBlockBytes = kQ41 ? 20 : 18;
  auto* sw = reinterpret_cast<float*>(dst + L.w_sw());
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < L.nb; ++b) {
    const uint8_t* blk = src + b * kBlockBytes;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kQ41 ? 4 : 2)));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
    if constexpr (!kQ41) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    StoreI(dst + 32 * b, v);
    _mm256_storeu_ps(sw + 8 * b, _mm256_set1_ps(Half(blk)));
    mw[b] = kQ41 ? Half(blk + 2) : 0.f;
  }
}

// Q5_0 as signed q - 16: the nibbles as for Q4_0, then every byte whose fifth bit (in qh) is clear
// gets 0xF0 or-ed in (nibble | 0xF0 = nibble - 16 as int8); one whose bit is set is q - 16.
void PackQ5_0(const uint8_t* src, const Layout& L, uint8_t* dst) {
  auto* sw = reinterpret_cast<float*>(dst + L.w_sw());
  const __m256i m4 = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(static_cast<char>(0xF0));
  // Byte j of the result picks byte j / 8 of qh (broadcast to every dword) and tests bit j % 8.
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                        2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  for (int64_t b = 0; b < L.nb; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ5_0);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
    int32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const __m256i sel = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), pick), bit);
    const __m256i set = _mm256_cmpeq_epi8(sel, bit);
    StoreI(dst + 32 * b, _mm256_or_si256(v, _mm256_andnot_si256(set, high)));
    _mm256_storeu_ps(sw + 8 * b, _mm256_set1_ps(Half(blk)));
  }
}

void PackQ8_0(const uint8_t* src, const Layout& L, uint8_t* dst) {
  auto* sw = reinterpret_cast<float*>(dst + L.w_sw());
  for (int64_t b = 0; b < L.nb; ++b) {
    StoreI(dst + 32 * b, LoadI(src + 34 * b + 2));
    _mm256_storeu_ps(sw + 8 * b, _mm256_set1_ps(Half(src + 34 * b)));
  }
}

void PackQ4_K(const uint8_t* src, const Layout& L, uint8_t* dst) {
  auto* sw = reinterpret_cast<float*>(dst + L.w_sw());
  auto* mw = reinterpret_cast<float*>(dst + L.w_mw());
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < L.nb / 8; ++sb) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(src + sb * sizeof(BlockQ4_K));
    const float d = _cvtsh_ss(blk->d), dmin = _cvtsh_ss(blk->dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      GetScaleMinK4(j, blk->scales, &sc, &m);
      _mm256_storeu_ps(sw + 8 * (8 * sb + j), _mm256_set1_ps(d * sc));
      mw[8 * sb + j] = -(dmin * m);
    }
    for (int c = 0; c < 4; ++c) {
      const __m256i q = LoadI(blk->qs + 32 * c);
      StoreI(dst + 256 * sb + 64 * c, _mm256_and_si256(q, m4));
      StoreI(dst + 256 * sb + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    }
  }
}

void PackQ6_K(const uint8_t* src, const Layout& L, uint8_t* dst) {
  auto* sw = reinterpret_cast<float*>(dst + L.w_sw());
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i off = _mm256_set1_epi8(32);
  for (int64_t sb = 0; sb < L.nb / 8; ++sb) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(src + sb * sizeof(BlockQ6_K));
    const float d = _cvtsh_ss(blk->d);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = LoadI(blk->ql + 64 * h), ql1 = LoadI(blk->ql + 64 * h + 32);
      const __m256i qh = LoadI(blk->qh + 32 * h);
      const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int t = 0; t < 4; ++t) {  // elements 32t..32t+31 of this half: qh bits 2t, 2t+1
        const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), m3), 4);
        const int64_t j = 8 * sb + 4 * h + t;
        StoreI(dst + 32 * j, _mm256_sub_epi8(_mm256_or_si256(lo[t], hb), off));
        const __m128 s0 = _mm_set1_ps(d * blk->scales[8 * h + 2 * t]);
        const __m128 s1 = _mm_set1_ps(d * blk->scales[8 * h + 2 * t + 1]);
        _mm256_storeu_ps(sw + 8 * j, _mm256_set_m128(s1, s0));
      }
    }
  }
}

void PackFloat(DType t, const uint8_t* src, int64_t k, uint8_t* dst) {
  auto* out = reinterpret_cast<float*>(dst);
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (t == DType::kF32) {
    std::memcpy(out, src, k * 4);
    i = k;
  } else if (t == DType::kF16) {
    for (; i + 8 <= k; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
    for (; i < k; ++i) out[i] = Fp16ToFp32(h[i]);
  } else {
    for (; i + 8 <= k; i += 8) {
      const __m256i v =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
      _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; ++i) out[i] = Bf16ToFp32(h[i]);
  }
  for (; i < RoundUp(k, 8); ++i) out[i] = 0;
}

void PackRow(DType t, const uint8_t* src, int64_t k, uint8_t* dst) {
  const Layout L(k);
  if (!IsFloat(t)) std::memset(dst + L.w_mw(), 0, L.nb8 * 4);  // mw: 0 unless set below
  switch (t) {
    case DType::kQ4_0: PackQ4<false>(src, L, dst); return;
    case DType::kQ4_1: PackQ4<true>(src, L, dst); return;
    case DType::kQ5_0: PackQ5_0(src, L, dst); return;
    case DType::kQ8_0: PackQ8_0(src, L, dst); return;
    case DType::kQ4_K: PackQ4_K(src, L, dst); return;
    case DType::kQ6_K: PackQ6_K(src, L, dst); return;
    default: PackFloat(t, src, k, dst); return;
  }
}

// ---- microkernels: 4 weight rows x C activation rows ----

template <int C, bool kSigned, bool kMin>
void QKernel(const uint8_t* wt, int64_t wstride, const uint8_t* act, int64_t astride,
             const Layout& L, float* y, int64_t ldy, int nr) {
  __m256 acc[kTileRows][C];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < L.nb; ++b) {
    __m256i a[C];
    __m256 sa[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      a[c] = LoadI(act + c * astride + 32 * b);
      sa[c] =
          _mm256_broadcast_ss(reinterpret_cast<const float*>(act + c * astride + L.act_sa()) + b);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kTileRows; ++r) {
      const uint8_t* w = wt + r * wstride;
      const __m256i q = LoadI(w + 32 * b);
      const __m256 sw = _mm256_loadu_ps(reinterpret_cast<const float*>(w + L.w_sw()) + 8 * b);
      const __m256i uq = kSigned ? _mm256_sign_epi8(q, q) : q;
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m256i sq = kSigned ? _mm256_sign_epi8(a[c], q) : a[c];
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(uq, sq), ones);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sw, sa[c]), acc[r][c]);
      }
    }
  }
  if constexpr (kMin) {
    for (int64_t b = 0; b < L.nb8; b += 8) {
      for (int c = 0; c < C; ++c) {
        const __m256 s =
            _mm256_loadu_ps(reinterpret_cast<const float*>(act + c * astride + L.act_ss()) + b);
        for (int r = 0; r < kTileRows; ++r) {
          const __m256 m =
              _mm256_loadu_ps(reinterpret_cast<const float*>(wt + r * wstride + L.w_mw()) + b);
          acc[r][c] = _mm256_fmadd_ps(m, s, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < nr; ++r) {
    for (int c = 0; c < C; ++c) y[c * ldy + r] = HorizontalSum(acc[r][c]);
  }
}

template <int C>
void FKernel(const uint8_t* wt, int64_t wstride, const uint8_t* act, int64_t astride,
             const Layout& L, float* y, int64_t ldy, int nr) {
  __m256 acc[kTileRows][C];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < L.k8; i += 8) {
    __m256 a[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      a[c] = _mm256_loadu_ps(reinterpret_cast<const float*>(act + c * astride) + i);
#pragma GCC unroll 4
    for (int r = 0; r < kTileRows; ++r) {
      const __m256 w = _mm256_loadu_ps(reinterpret_cast<const float*>(wt + r * wstride) + i);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(w, a[c], acc[r][c]);
    }
  }
  for (int r = 0; r < nr; ++r) {
    for (int c = 0; c < C; ++c) y[c * ldy + r] = HorizontalSum(acc[r][c]);
  }
}

using KernelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, const Layout&, float*,
                          int64_t, int);

const KernelFn* KernelsFor(DType t) {
  static constexpr KernelFn kSignedK[kMaxCols] = {QKernel<1, true, false>, QKernel<2, true, false>};
  static constexpr KernelFn kUnsignedMin[kMaxCols] = {QKernel<1, false, true>,
                                                      QKernel<2, false, true>};
  static constexpr KernelFn kFloat[kMaxCols] = {FKernel<1>, FKernel<2>};
  if (IsFloat(t)) return kFloat;
  return t == DType::kQ4_1 || t == DType::kQ4_K ? kUnsignedMin : kSignedK;
}

void Gemm(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m, int64_t r0,
          int64_t r1, float* y, int64_t ldy) {
  const Layout L(w.cols);
  const int64_t tile_row_bytes = IsFloat(w.dtype) ? RoundUp(w.cols, 16) * 4 : L.w_bytes();
  const GemmParts<Layout> parts{L, tile_row_bytes, KernelsFor(w.dtype), PackRow};
  TiledGemm<kTileRows, kMaxCols>(parts, w, act, act_row_bytes, m, r0, r1, y, ldy);
}

}  // namespace
}  // namespace avx2

const IsaImpl* Avx2Isa() {
  static const IsaImpl impl{"avx2",
                            avx2::ActRowBytes,
                            avx2::QuantizeAct,
                            avx2::Gemm,
                            SiluMulAvx2,
                            GeluMulAvx2,
                            RoundToFp16Avx2,
                            ExpSumAvx2,
                            AttendTileAvx2,
                            QuantizeActRows16Scalar,
                            GemmRows16Scalar};
  return &impl;
}

}  // namespace tandem::kernels::internal
