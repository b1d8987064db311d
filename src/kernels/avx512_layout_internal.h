// Packed layouts of the AVX-512 MatMul path (internal; include only from files compiled with
// the AVX-512 flags).
//
// Quantized types work on groups of 128 elements; a row is zero-padded to `groups` groups. A
// group is two 64-byte halves A and B; int32 lane L (0..15) of vpdpbusd sums the 4 products of
// bytes 4L..4L+3 of A plus those of B, and the 8 elements a lane sees always share one weight
// scale and one activation scale. Which elements go where ("order") depends on the type:
//   kSplit (Q4_0, Q4_1, Q5_0, Q8_0): A = elements 0-15 of the group's 4 blocks of 32, B =
//     elements 16-31 (matches the low / high nibbles of Q4 / Q5 blocks). Lanes 4b..4b+3 = block b.
//   kLanes (Q4_K, Q6_K): lane L owns elements 8L..8L+3 (in A) and 8L+4..8L+7 (in B).
//
// Activation row (act_bytes):             Weight tile row (w_bytes):
//   qa s8 [groups*128]  q                   qw u8 [groups*128]  weight integer, >= 0
//   sa f32[groups*16]   lane scale          sw f32[groups*16]   lane scale
//   ss f32[nmin16]      per min block:      mw f32[nmin16]      per min block additive term
//                       scale * sum(q)
// dot = sum over lanes of (sum qw*qa) * sw * sa + sum over min blocks of mw * ss.
// Weights with an offset are stored as unsigned and the offset moves into mw: Q4_0 q - 8
// -> mw = -8 d; Q5_0 q - 16 -> mw = -16 d; Q8_0 q -> q + 128, mw = -128 d; Q6_K q - 32 -> mw = -32
// d sc (per 16); Q4_1 mw = m; Q4_K mw = -dmin m. Min blocks are 16 elements for Q6_K, 32 otherwise.
// Float types (F32/F16/BF16): both sides are plain f32 rows zero-padded to k16 elements.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/gemm_driver_internal.h"
#include "kernels/isa_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal::avx512 {

inline constexpr int kTileRows = 4;  // weight rows per packed tile

inline bool IsFloat(DType t) { return IsFloatType(t); }

struct QLayout {
  int64_t k16;     // k rounded up to 16 (float types)
  int64_t groups;  // 128-element groups
  int64_t nmin16;  // min blocks, rounded up to 16
  QLayout(int64_t k, DType t)
      : k16(RoundUp(k, 16)),
        groups((k + 127) / 128),
        nmin16(RoundUp(t == DType::kQ6_K ? groups * 8 : groups * 4, 16)) {}
  int64_t act_sa() const { return groups * 128; }
  int64_t act_ss() const { return groups * 192; }
  int64_t act_bytes() const { return groups * 192 + nmin16 * 4; }
  int64_t w_sw() const { return groups * 128; }
  int64_t w_mw() const { return groups * 192; }
  int64_t w_bytes() const { return groups * 192 + nmin16 * 4; }
};

// permutex2var_epi32 indices building halves A (row 0) and B (row 1) from two source vectors
// (indices >= 16 pick the second). pos(n) says where natural dword n of the group lives.
template <typename Pos>
constexpr std::array<std::array<int32_t, 16>, 2> MakeIdx(Pos pos) {
  std::array<std::array<int32_t, 16>, 2> idx{};
  for (int j = 0; j < 16; ++j) {
    idx[0][j] = pos(2 * j);
    idx[1][j] = pos(2 * j + 1);
  }
  return idx;
}
// kLanes order from sources = elements 0..63 and 64..127 in natural order.
alignas(64) inline constexpr auto kIdxLanes = MakeIdx([](int n) { return n; });
// kLanes order from sources = low / high nibbles of 64 Q4_K qs bytes
// (low: elements 0-31 | 64-95 of the group, high: 32-63 | 96-127).
alignas(64) inline constexpr auto kIdxQ4K = MakeIdx([](int n) {
  return n < 8 ? n : n < 16 ? 16 + n - 8 : n < 24 ? n - 8 : n;
});

inline __m512i Combine(__m128i a, __m128i b, __m128i c, __m128i d) {
  const __m512i v = _mm512_inserti32x4(_mm512_castsi128_si512(a), b, 1);
  return _mm512_inserti32x4(_mm512_inserti32x4(v, c, 2), d, 3);
}
// 4 per-32-element scales (one per 32-bit element of s4) -> 16 lanes (4 each).
inline __m512 Expand4(__m128 s4) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                               _mm512_castps128_ps512(s4));
}
// 4 scales in the even elements of s8 -> 16 lanes (4 each).
inline __m512 Expand4Even(__m256 s8) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
                               _mm512_castps256_ps512(s8));
}
// 8 per-16-element scales -> 16 lanes (2 each).
inline __m512 Expand8(__m256 s8) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                               _mm512_castps256_ps512(s8));
}

// One group (4 blocks) of a Q4_0 / Q4_1 / Q8_0 row in kSplit order, straight from the GGUF
// bytes, zero-padded past nb blocks. a / b: the two halves as unsigned weight integers (Q8_0:
// q + 128). f: the first two halves of each block as floats, d0 x0 d1 x1 d2 x2 d3 x3 (x = m for
// Q4_1, junk otherwise).
struct SplitGroup {
  __m512i a, b;
  __m256 f;
};

template <DType kType>
inline SplitGroup LoadSplitGroup(const uint8_t* row, int64_t g, int64_t nb) {
  static_assert(kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ8_0);
  constexpr bool kQ8 = kType == DType::kQ8_0;
  constexpr int kBB = kType == DType::kQ4_1 ? 20 : kType == DType::kQ4_0 ? 18 : 34;
  constexpr int kQs = kType == DType::kQ4_1 ? 4 : 2;  // offset of the quants in a block
  const uint8_t* blk = row + 4 * g * kBB;
  auto load128 = [](const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  };
  __m128i lo[4], hi[4];
  __m128i dm;
  if (nb - 4 * g >= 4) {
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      lo[b] = load128(blk + b * kBB + kQs);
      if constexpr (kQ8) hi[b] = load128(blk + b * kBB + kQs + 16);
    }
    // The 16-bit words d (and m) of the 4 blocks, gathered with one word permute.
    if constexpr (kQ8) {
      // d_b lands in word 2b (odd words: junk).
      const __m512i idx = _mm512_setr_epi32(0, 17, 34, 51, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
      const __m512i w =
          _mm512_permutex2var_epi16(_mm512_loadu_si512(blk), idx, _mm512_loadu_si512(blk + 64));
      dm = _mm512_castsi512_si128(w);
    } else {
      constexpr int kW = kBB / 2;  // words per block
      const __m512i idx =
          _mm512_setr_epi32(0 | (1 << 16), kW | ((kW + 1) << 16), 2 * kW | ((2 * kW + 1) << 16),
                            3 * kW | ((3 * kW + 1) << 16), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
      dm = _mm512_castsi512_si128(_mm512_permutexvar_epi16(idx, _mm512_loadu_si512(blk)));
    }
  } else {
    alignas(16) int dms[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      if (4 * g + b < nb) {
        lo[b] = load128(blk + b * kBB + kQs);
        hi[b] = kQ8 ? load128(blk + b * kBB + kQs + 16) : _mm_setzero_si128();
        uint32_t v = 0;
        std::memcpy(&v, blk + b * kBB, kType == DType::kQ4_1 ? 4 : 2);
        dms[b] = static_cast<int>(v);
      } else {
        lo[b] = hi[b] = _mm_setzero_si128();
      }
    }
    dm = _mm_setr_epi32(dms[0], dms[1], dms[2], dms[3]);
  }
  SplitGroup s;
  s.f = _mm256_cvtph_ps(dm);
  if constexpr (kQ8) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    s.a = _mm512_xor_si512(Combine(lo[0], lo[1], lo[2], lo[3]), bias);
    s.b = _mm512_xor_si512(Combine(hi[0], hi[1], hi[2], hi[3]), bias);
  } else {
    const __m512i v = Combine(lo[0], lo[1], lo[2], lo[3]);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    s.a = _mm512_and_si512(v, m4);
    s.b = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  }
  return s;
}

// One group (4 blocks) of a Q5_0 row in kSplit order, zero-padded past nb blocks, as
// LoadSplitGroup: a / b = q (0..31), f = d0 x d1 x d2 x d3 x (x junk).
inline SplitGroup LoadQ5_0Group(const uint8_t* row, int64_t g, int64_t nb) {
  constexpr int kBB = 22;  // sizeof(block_q5_0): d, qh[4], qs[16]
  const uint8_t* blk = row + 4 * g * kBB;
  const int n = static_cast<int>(std::min<int64_t>(4, nb - 4 * g));  // blocks in this group
  // The group's bytes as two vectors; the masked loads read nothing past the last block.
  const int bytes = n * kBB;
  const __mmask64 m0 = bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1;
  const __mmask64 m1 = bytes > 64 ? (__mmask64{1} << (bytes - 64)) - 1 : 0;
  const __m512i head = _mm512_maskz_loadu_epi8(m0, blk);
  const __m512i tail = _mm512_maskz_loadu_epi8(m1, blk + 64);
  // One word permute: d_b -> word 2b; the low halves of qh_0..qh_3 -> words 8..11, the high
  // halves -> words 12..15. Block b's words start at 11b (d), then 11b + 1, 11b + 2 (qh).
  const __m512i idx = _mm512_setr_epi32(0, 11, 22, 33, 1 | (12 << 16), 23 | (34 << 16),
                                        2 | (13 << 16), 24 | (35 << 16), 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i w = _mm512_permutex2var_epi16(head, idx, tail);
  // Bit 16b + j of qh64[0] is the fifth bit of element j of block b, i.e. of byte 16b + j of
  // half A; qh64[1] the same for half B (elements 16 + j).
  const __m128i qh64 = _mm512_extracti32x4_epi32(w, 1);
  const __mmask64 fifth_a = _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(qh64)));
  const __mmask64 fifth_b = _cvtu64_mask64(static_cast<uint64_t>(_mm_extract_epi64(qh64, 1)));
  __m128i qs[4];
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    qs[b] = b < n ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + b * kBB + 6))
                  : _mm_setzero_si128();
  }
  const __m512i v = Combine(qs[0], qs[1], qs[2], qs[3]);
  const __m512i m4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  const __m512i lo = _mm512_and_si512(v, m4);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  SplitGroup s;
  s.a = _mm512_mask_add_epi8(lo, fifth_a, lo, bit4);
  s.b = _mm512_mask_add_epi8(hi, fifth_b, hi, bit4);
  s.f = _mm256_cvtph_ps(_mm512_castsi512_si128(w));
  return s;
}

inline __m512i LoadBytes(const void* p) { return _mm512_loadu_si512(p); }

// Rounds to the nearest integer, ties to even.
inline __m512i Rne(__m512 v) {
  return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline float RoundHalf(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

// One block of 32 activations quantized with the Q8_0 / Q8_1 numerics (quant_blocks_internal.h):
// q = rne(x * 127 / amax) as elements 0-15 (lo) and 16-31 (hi), d = amax / 127 (unrounded),
// sum = sum of q.
struct Q8Block {
  __m128i lo, hi;
  float d;
  int sum;
};
inline Q8Block QuantizeQ8Block(const float* x) {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const __m512 id = _mm512_set1_ps(amax != 0 ? 127.f / amax : 0.f);
  const __m512i q0 = Rne(_mm512_mul_ps(x0, id)), q1 = Rne(_mm512_mul_ps(x1, id));
  return {_mm512_cvtepi32_epi8(q0), _mm512_cvtepi32_epi8(q1), amax / 127.f,
          _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))};
}

// One weight group as PackRow lays it out, built in registers: halves a / b, lane scales sw, and
// the group's additive terms written into mw (the row's nmin16 floats, PackRow's w_mw part).
struct GroupRegs {
  __m512i a, b;
  __m512 sw;
};

// Q4_0 / Q4_1 / Q5_0 / Q8_0 (PackSplit).
template <DType kType>
struct SplitReader {
  int64_t nb;  // blocks of 32 in a row
  __m256i pick = kType == DType::kQ4_1 ? _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)
                                       : _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  float offset = kType == DType::kQ4_1   ? 1.f
                 : kType == DType::kQ4_0 ? -8.f
                 : kType == DType::kQ5_0 ? -16.f
                                         : -128.f;
  GroupRegs Read(const uint8_t* row, int64_t g, float* mw) const {
    SplitGroup q;
    if constexpr (kType == DType::kQ5_0) {
      q = LoadQ5_0Group(row, g, nb);
    } else {
      q = LoadSplitGroup<kType>(row, g, nb);
    }
    const __m256 m = _mm256_mul_ps(_mm256_permutevar8x32_ps(q.f, pick), _mm256_set1_ps(offset));
    _mm_storeu_ps(mw + 4 * g, _mm256_castps256_ps128(m));
    return {q.a, q.b, Expand4Even(q.f)};
  }
};

// Q4_K (PackQ4_K): group g is half g % 2 of super-block g / 2.
struct Q4KReader {
  int64_t nb;  // unused: K-quant rows are whole super-blocks
  GroupRegs Read(const uint8_t* row, int64_t g, float* mw) const {
    const int64_t sb = g / 2;
    const int h = static_cast<int>(g % 2);
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(row + sb * sizeof(BlockQ4_K));
    uint32_t u[3];
    std::memcpy(u, blk->scales, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0)));
    const __m256 scale = _mm256_mul_ps(sc, _mm256_set1_ps(_cvtsh_ss(blk->d)));
    if (h == 0) {
      const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
      const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
          _mm_setr_epi32(static_cast<int>(m_lo), static_cast<int>(m_hi), 0, 0)));
      _mm256_storeu_ps(mw + 8 * sb, _mm256_mul_ps(mn, _mm256_set1_ps(-_cvtsh_ss(blk->dmin))));
    }
    const __m512i v = LoadBytes(blk->qs + 64 * h);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_and_si512(v, m4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    const __m128 s4 = h == 0 ? _mm256_castps256_ps128(scale) : _mm256_extractf128_ps(scale, 1);
    return {_mm512_permutex2var_epi32(lo, LoadBytes(kIdxQ4K[0].data()), hi),
            _mm512_permutex2var_epi32(lo, LoadBytes(kIdxQ4K[1].data()), hi), Expand4(s4)};
  }
};

// Q6_K (PackQ6_K): group g is half g % 2 of super-block g / 2.
struct Q6KReader {
  int64_t nb;  // unused
  GroupRegs Read(const uint8_t* row, int64_t g, float* mw) const {
    const int64_t sb = g / 2;
    const int h = static_cast<int>(g % 2);
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(row + sb * sizeof(BlockQ6_K));
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(blk->d));
    const __m512i ql = LoadBytes(blk->ql + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
    const __m512i hx = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i h_lo = _mm512_slli_epi16(_mm512_and_si512(hx, m3), 4);
    const __m512i h_hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hx, 4), m3), 4);
    const __m512i n0 = _mm512_or_si512(_mm512_and_si512(ql, m4), h_lo);
    const __m512i n1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h_hi);
    const __m128i sc8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->scales + 8 * h));
    const __m256 scale = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), d);
    _mm256_storeu_ps(mw + 16 * sb + 8 * h, _mm256_mul_ps(scale, _mm256_set1_ps(-32.f)));
    return {_mm512_permutex2var_epi32(n0, LoadBytes(kIdxLanes[0].data()), n1),
            _mm512_permutex2var_epi32(n0, LoadBytes(kIdxLanes[1].data()), n1), Expand8(scale)};
  }
};

// Packs one weight row (k elements of type t, GGUF layout) into a tile row.
void PackRow(DType t, const uint8_t* src, int64_t k, uint8_t* dst);

}  // namespace tandem::kernels::internal::avx512
