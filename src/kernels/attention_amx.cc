// AttendTile on AMX tiles (TDPBF16PS: 16 x 16 fp32 += (16 x 32 bf16) * (32 x 16 bf16)), and the
// "amx" kernel table: the avx512 table with this attention. Compiled with the AMX and AVX-512
// BF16 flags and reached only through that table, which cpu_isa.cc picks only on CPUs (and
// kernels) that run AMX-BF16 and granted this process the tile state.
//
// Numerics: queries, keys, values and softmax weights are rounded to bf16 (8 significant bits,
// round to nearest even) and multiplied with fp32 accumulation; the online softmax (max, exp,
// sum, rescaling) stays fp32, and its sum is taken over the rounded weights so that the weights
// applied to V add up to the divisor. Every query row goes through the same tile operations
// whatever rows share its tile (a tile row's result depends on that row alone), so the result
// is batch-invariant like the other paths.
//
// Per span of 32 positions (two KV blocks), per tile of 16 query rows: S = Q K^T (head_dim / 32
// tile products per block), softmax of S in AVX-512 registers, O += P V (head_dim / 16 tile
// products of 32 keys each; O is kept in memory: 16 rows of head_dim floats do not fit the 8
// tile registers).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/exp_avx512_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kTileRows = 16;  // query rows per tile
constexpr int kSpan = 32;      // positions per step: two 16-position blocks, 2k and 2k + 1
constexpr int kPairs = kSpan / 2;

// Every tile register is 16 rows of 64 bytes (the AMX intrinsics take registers as literal
// numbers). While scores are computed: 0 and 6 hold S of the two blocks (16 rows x 16 keys fp32),
// 1 a Q chunk (16 rows x 32 dims bf16), 2 and 7 K chunks of the two blocks (16 dim pairs x 16
// keys x 2). While values are summed: 4 holds P (16 rows x 32 keys bf16), 3 and 0 O chunks
// (16 rows x 16 dims fp32), 5 and 2 V chunks (16 key pairs x 16 dims x 2); two of each so that
// consecutive chunks are independent.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row
  uint8_t rows[16];
};

void ConfigureTiles() {
  TileConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

inline __m512i AsI(__m512bh x) { return (__m512i)x; }  // NOLINT: a vector reinterpretation

// 32 bf16 interleaving two rows of 16 fp16: element 2j is lo[j], 2j + 1 is hi[j] (the pair
// layout of a TDPBF16PS B operand). hi may be null (zeros).
inline __m512i InterleavePair(const uint16_t* lo, const uint16_t* hi) {
  const __m512 flo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)));
  const __m512 fhi = hi != nullptr
                         ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)))
                         : _mm512_setzero_ps();
  // cvtne2ps_pbh(a, b): elements 0..15 from b, 16..31 from a.
  const __m512i packed = AsI(_mm512_cvtne2ps_pbh(fhi, flo));
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, packed);
}

// Keys of one 16-position block, (hd, 16) fp16, as (hd / 2, 16, 2) bf16; zeros when absent.
void ConvertKeys(const uint16_t* kh, int hd, uint16_t* kb) {
  for (int d = 0; d < hd; d += 2) {
    _mm512_store_si512(kb + d * 16, kh != nullptr ? InterleavePair(kh + d * 16, kh + (d + 1) * 16)
                                                  : _mm512_setzero_si512());
  }
}

// Values of positions [0, n) of one block, (16, hd) fp16, as its 8 key pairs of (kPairs, hd, 2)
// bf16 at vb; positions >= n are zeros, never read (their weight is 0, but 0 * whatever is
// stored there need not be 0).
void ConvertValues(const uint16_t* vh, int n, int hd, uint16_t* vb) {
  for (int m = 0; m < 8; ++m) {
    for (int v = 0; v < hd / 16; ++v) {
      uint16_t* dst = vb + (static_cast<int64_t>(m) * hd + 16 * v) * 2;
      if (2 * m >= n) {
        _mm512_store_si512(dst, _mm512_setzero_si512());
        continue;
      }
      const uint16_t* lo = vh + static_cast<int64_t>(2 * m) * hd + 16 * v;
      _mm512_store_si512(dst, InterleavePair(lo, 2 * m + 1 < n ? lo + hd : nullptr));
    }
  }
}

// x rounded to bf16 and widened back to fp32 (exact); the bf16 values as a (16) vector.
inline __m512 RoundToBf16(__m512 x, __m256i* bits) {
  *bits = (__m256i)_mm512_cvtneps_pbh(x);  // NOLINT: a vector reinterpretation
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*bits), 16));
}

}  // namespace

// block_tokens == 16 and head_dim % 32 == 0 (<= 256); other shapes take AttendTileAvx512.
//
// Positions go in spans of 32 that always start at an even block (2k, 2k + 1), whatever the
// tile's first position, so that a row meets the same spans in every call: a block no row of the
// tile sees is zeros with its scores masked, which adds exactly nothing.
void AttendTileAmx(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                   int64_t q_stride, float* out, int64_t out_stride) {
  if (a.block_tokens != 16 || a.head_dim % 32 != 0) {
    AttendTileAvx512(a, first_pos, n_tokens, q, q_stride, out, out_stride);
    return;
  }
  const int hd = a.head_dim, g = a.group;
  const int rows = n_tokens * g;
  const int padded = (rows + kTileRows - 1) / kTileRows * kTileRows;
  const int nv = hd / 16;  // 16-wide vectors per head row
  // (padded, hd) fp32 accumulators and bf16 queries; padding rows are zeros and never written out.
  thread_local std::vector<float> acc_buf;
  acc_buf.assign(static_cast<size_t>(padded) * hd, 0.0f);
  float* acc = acc_buf.data();
  thread_local std::vector<uint16_t> q_buf;
  q_buf.assign(static_cast<size_t>(padded) * hd, 0);
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + (r / g) * q_stride + static_cast<int64_t>(r % g) * hd;
    for (int v = 0; v < nv; ++v) {
      __m256i bits;
      RoundToBf16(_mm512_loadu_ps(qr + 16 * v), &bits);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&q_buf[static_cast<size_t>(r) * hd + 16 * v]),
                          bits);
    }
  }
  // Span scratch, bf16: each block's keys (hd / 2, 16, 2), the span's values (kPairs, hd, 2).
  alignas(64) uint16_t kb[2][kMaxAttentionHeadDim * 16];
  alignas(64) uint16_t vb[kPairs * kMaxAttentionHeadDim * 2];
  alignas(64) float s[2][kTileRows][16];
  alignas(64) uint16_t p[kTileRows][kSpan];
  AttentionRowState st[kMaxAttentionRows];
  for (int r = 0; r < padded; ++r) st[r] = {-INFINITY, 0.0f};
  const __m512 scale = _mm512_set1_ps(a.scale);
  const int last_key = LastKey(a, first_pos + n_tokens - 1);
  const int first_block = FirstVisibleBlock(a, first_pos);
  ConfigureTiles();
  for (int start = first_block / 2 * kSpan; start <= last_key; start += kSpan) {
    // Positions of the span in each block that exist (0: the block is absent or unseen).
    int n_block[2];
    for (int h = 0; h < 2; ++h) {
      const int bi = start / 16 + h;
      n_block[h] = bi < first_block ? 0 : std::clamp(last_key + 1 - bi * 16, 0, 16);
      ConvertKeys(n_block[h] > 0 ? a.keys[bi] : nullptr, hd, kb[h]);
      // An absent block's values are all zeros (n 0: the block is never read).
      ConvertValues(n_block[h] > 0 ? a.values[bi] : nullptr, n_block[h], hd,
                    vb + static_cast<int64_t>(h) * (kPairs / 2) * hd * 2);
    }
    for (int r0 = 0; r0 < rows; r0 += kTileRows) {
      // valid[i]: the span's positions row i sees (none for padding rows).
      uint32_t valid[kTileRows];
      bool any = false;
      for (int i = 0; i < kTileRows; ++i) {
        const int pos = first_pos + std::min(r0 + i, rows - 1) / g;
        const int lo = std::max(RowKeyStart(a, pos), start) - start;
        const int hi = std::min(std::min(pos, last_key) + 1 - start, kSpan);  // causal
        valid[i] = r0 + i < rows && hi > lo
                       ? static_cast<uint32_t>((uint64_t{1} << hi) - (uint64_t{1} << lo))
                       : 0u;
        any = any || valid[i] != 0;
      }
      if (!any) continue;
      _tile_zero(0);
      _tile_zero(6);
      for (int c = 0; c < hd / 32; ++c) {
        _tile_loadd(1, q_buf.data() + static_cast<int64_t>(r0) * hd + 32 * c, hd * 2);
        _tile_loadd(2, kb[0] + c * 16 * 32, 64);
        _tile_loadd(7, kb[1] + c * 16 * 32, 64);
        _tile_dpbf16ps(0, 1, 2);
        _tile_dpbf16ps(6, 1, 7);
      }
      _tile_stored(0, s[0], 64);
      _tile_stored(6, s[1], 64);
      bool rescale = false;
      float corr[kTileRows];
      for (int i = 0; i < kTileRows; ++i) {
        corr[i] = 1.0f;
        if (valid[i] == 0) {
          _mm512_store_si512(p[i], _mm512_setzero_si512());
          continue;
        }
        const __mmask16 v0 = static_cast<__mmask16>(valid[i]),
                        v1 = static_cast<__mmask16>(valid[i] >> 16);
        const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
        const __m512 s0 =
            _mm512_mask_blend_ps(v0, minus_inf, _mm512_mul_ps(_mm512_load_ps(s[0][i]), scale));
        const __m512 s1 =
            _mm512_mask_blend_ps(v1, minus_inf, _mm512_mul_ps(_mm512_load_ps(s[1][i]), scale));
        AttentionRowState& state = st[r0 + i];
        const float m = std::max(state.max, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
        corr[i] = m == state.max ? 1.0f : std::exp(state.max - m);  // exp(0) is exactly 1
        const __m512 mv = _mm512_set1_ps(m);
        __m256i b0, b1;
        const __m512 p0 = RoundToBf16(_mm512_maskz_mov_ps(v0, Exp16(_mm512_sub_ps(s0, mv))), &b0);
        const __m512 p1 = RoundToBf16(_mm512_maskz_mov_ps(v1, Exp16(_mm512_sub_ps(s1, mv))), &b1);
        _mm512_store_si512(p[i], _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1));
        state = {m, state.sum * corr[i] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1))};
        rescale = rescale || corr[i] != 1.0f;
      }
      float* acc_tile = acc + static_cast<int64_t>(r0) * hd;
      if (rescale) {  // multiplying by exactly 1 changes nothing, so rows with corr 1 are skipped
        for (int i = 0; i < kTileRows; ++i) {
          if (corr[i] == 1.0f) continue;
          const __m512 c = _mm512_set1_ps(corr[i]);
          float* ar = acc_tile + static_cast<int64_t>(i) * hd;
          for (int v = 0; v < nv; ++v) {
            _mm512_storeu_ps(ar + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(ar + 16 * v), c));
          }
        }
      }
      // O chunk v += P (16 x 32) * V chunk v (32 keys x 16 dims), two chunks in flight (nv even).
      _tile_loadd(4, p, 64);
      for (int v = 0; v < nv; v += 2) {
        _tile_loadd(3, acc_tile + 16 * v, hd * 4);
        _tile_loadd(5, vb + 32 * v, hd * 4);
        _tile_loadd(0, acc_tile + 16 * (v + 1), hd * 4);
        _tile_loadd(2, vb + 32 * (v + 1), hd * 4);
        _tile_dpbf16ps(3, 4, 5);
        _tile_dpbf16ps(0, 4, 2);
        _tile_stored(3, acc_tile + 16 * v, hd * 4);
        _tile_stored(0, acc_tile + 16 * (v + 1), hd * 4);
      }
    }
  }
  _tile_release();
  StoreAttentionRows(a, acc, st, n_tokens, out, out_stride);
}

const IsaImpl* AmxIsa() {
  static const IsaImpl impl = [] {
    IsaImpl t = *Avx512Isa();
    t.name = "amx";
    t.attend_tile = AttendTileAmx;
    return t;
  }();
  return &impl;
}

}  // namespace tandem::kernels::internal
