// AttendTile on AVX2 + FMA + F16C (this file is compiled with those flags; reached only through
// the avx2 table). The AVX-512 kernel's scheme (attention_avx512.cc) on 8-wide registers: a
// block's 16 scores of a query row are two registers, and rows go in groups of 4 that share
// every loaded K and V vector.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/avx2_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kRows = 4;  // query rows sharing each loaded K / V vector
constexpr int kVecs = 2;  // 8-wide output vectors per row kept in registers

inline __m256 Fp16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// All-ones lanes where lane index (base + 0..7) lies in [j0, n).
inline __m256 LaneMask(int base, int j0, int n) {
  const __m256i idx =
      _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(j0 - 1));
  const __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
  return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

// acc_i[8 * v0, 8 * (v0 + VC)) = acc_i * corr[i] + sum over j in [jlo, jhi) of p[i][j] * V[j]
// for the kRows rows i of a group, in increasing j (one FMA per row, vector and key).
// vf: (16, hd) fp32 values of the block.
template <int VC>
inline void PvChunk(const float* vf, int hd, int v0, int jlo, int jhi, const float (&p)[kRows][16],
                    const float (&corr)[kRows], float* const (&acc)[kRows]) {
  __m256 av[kRows][VC];
  for (int i = 0; i < kRows; ++i) {
    const __m256 c = _mm256_set1_ps(corr[i]);
    for (int c4 = 0; c4 < VC; ++c4)
      av[i][c4] = _mm256_mul_ps(_mm256_loadu_ps(acc[i] + 8 * (v0 + c4)), c);
  }
  for (int j = jlo; j < jhi; ++j) {
    const float* vj = vf + j * hd + 8 * v0;
    __m256 vv[VC];
    for (int c4 = 0; c4 < VC; ++c4) vv[c4] = _mm256_load_ps(vj + 8 * c4);
    for (int i = 0; i < kRows; ++i) {
      const __m256 pb = _mm256_broadcast_ss(&p[i][j]);
      for (int c4 = 0; c4 < VC; ++c4) av[i][c4] = _mm256_fmadd_ps(pb, vv[c4], av[i][c4]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int c4 = 0; c4 < VC; ++c4) _mm256_storeu_ps(acc[i] + 8 * (v0 + c4), av[i][c4]);
  }
}

}  // namespace

// For block_tokens == 16 and head_dim % 8 == 0 (<= 256); other shapes take the portable path.
// Every row performs the same operations whatever group or tile it is in (a row outside the
// group's key range adds p = 0), so results are batch-invariant.
void AttendTileAvx2(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                    int64_t q_stride, float* out, int64_t out_stride) {
  if (a.block_tokens != 16 || a.head_dim % 8 != 0) {
    AttendTileScalar(a, first_pos, n_tokens, q, q_stride, out, out_stride);
    return;
  }
  const int hd = a.head_dim, g = a.group;
  const int rows = n_tokens * g;
  const int nv = hd / 8;  // vectors per head row
  // (rows, head_dim) accumulators.
  thread_local std::vector<float> acc_buf;
  acc_buf.assign(static_cast<size_t>(rows) * hd, 0.0f);
  float* acc = acc_buf.data();
  alignas(32) float kf[kMaxAttentionHeadDim * 16];
  alignas(32) float vf[16 * kMaxAttentionHeadDim];
  AttentionRowState st[kMaxAttentionRows];
  for (int r = 0; r < rows; ++r) st[r] = {-INFINITY, 0.0f};
  const __m256 scale = _mm256_set1_ps(a.scale);
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  const int last_key = LastKey(a, first_pos + n_tokens - 1);
  const int first_block = FirstVisibleBlock(a, first_pos);
  alignas(32) float dummy_acc[kMaxAttentionHeadDim] = {};  // for rows missing from a group
  for (int bi = first_block, start = first_block * 16; start <= last_key; start += 16, ++bi) {
    const uint16_t* kh = a.keys[bi];
    const uint16_t* vh = a.values[bi];
    const int n_block = std::min(16, last_key + 1 - start);
    for (int i = 0; i < hd * 16; i += 8) _mm256_store_ps(kf + i, Fp16x8(kh + i));
    for (int i = 0; i < n_block * hd; i += 8) _mm256_store_ps(vf + i, Fp16x8(vh + i));
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      const float* qr[kRows];
      float* ar[kRows];
      int j0[kRows], n[kRows];
      bool active[kRows];
      int jlo = 16, jhi = 0;
      for (int i = 0; i < kRows; ++i) {
        const int r = std::min(r0 + i, rows - 1);
        const int t = r / g, gi = r % g;
        qr[i] = q + t * q_stride + static_cast<int64_t>(gi) * hd;
        n[i] = std::min(n_block, first_pos + t + 1 - start);  // causal
        j0[i] = std::max(0, RowKeyStart(a, first_pos + t) - start);
        active[i] = r0 + i < rows && n[i] > j0[i];
        ar[i] = active[i] ? acc + static_cast<int64_t>(r) * hd : dummy_acc;
        if (active[i]) {
          jlo = std::min(jlo, j0[i]);
          jhi = std::max(jhi, n[i]);
        }
      }
      if (jhi <= jlo) continue;  // no row of the group sees this block
      // Scores of keys 0..7 (lo) and 8..15 (hi) per row.
      __m256 lo[kRows], hi[kRows];
      for (int i = 0; i < kRows; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
      for (int d = 0; d < hd; ++d) {
        const __m256 k_lo = _mm256_load_ps(kf + d * 16);
        const __m256 k_hi = _mm256_load_ps(kf + d * 16 + 8);
        for (int i = 0; i < kRows; ++i) {
          const __m256 qd = _mm256_broadcast_ss(qr[i] + d);
          lo[i] = _mm256_fmadd_ps(qd, k_lo, lo[i]);
          hi[i] = _mm256_fmadd_ps(qd, k_hi, hi[i]);
        }
      }
      alignas(32) float pj[kRows][16];
      float corr[kRows];
      for (int i = 0; i < kRows; ++i) {
        if (!active[i]) {
          corr[i] = 1.0f;
          _mm256_store_ps(pj[i], _mm256_setzero_ps());
          _mm256_store_ps(pj[i] + 8, _mm256_setzero_ps());
          continue;
        }
        const __m256 valid_lo = LaneMask(0, j0[i], n[i]), valid_hi = LaneMask(8, j0[i], n[i]);
        const __m256 sc_lo = _mm256_blendv_ps(minus_inf, _mm256_mul_ps(lo[i], scale), valid_lo);
        const __m256 sc_hi = _mm256_blendv_ps(minus_inf, _mm256_mul_ps(hi[i], scale), valid_hi);
        AttentionRowState& state = st[r0 + i];
        const float m = std::max(state.max, HorizontalMax(_mm256_max_ps(sc_lo, sc_hi)));
        corr[i] = m == state.max ? 1.0f : std::exp(state.max - m);  // exp(0) is exactly 1
        const __m256 mb = _mm256_set1_ps(m);
        const __m256 p_lo = _mm256_and_ps(valid_lo, Exp8(_mm256_sub_ps(sc_lo, mb)));
        const __m256 p_hi = _mm256_and_ps(valid_hi, Exp8(_mm256_sub_ps(sc_hi, mb)));
        state = {m, state.sum * corr[i] + HorizontalSum(_mm256_add_ps(p_lo, p_hi))};
        _mm256_store_ps(pj[i], p_lo);
        _mm256_store_ps(pj[i] + 8, p_hi);
      }
      // acc[row] = acc[row] * corr + sum_j p[row][j] * V[j], kVecs 8-wide vectors at a time.
      int v0 = 0;
      for (; v0 + kVecs <= nv; v0 += kVecs) PvChunk<kVecs>(vf, hd, v0, jlo, jhi, pj, corr, ar);
      for (; v0 < nv; ++v0) PvChunk<1>(vf, hd, v0, jlo, jhi, pj, corr, ar);
    }
  }
  StoreAttentionRows(a, acc, st, n_tokens, out, out_stride);
}

}  // namespace tandem::kernels::internal
