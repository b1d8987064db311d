// AttendTile on AVX-512 (this file is compiled with the AVX-512 flags; reached only through
// the avx512 table).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/exp_avx512_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kRows = 4;  // query rows sharing each loaded K / V vector
constexpr int kVecs = 4;  // 16-wide output vectors per row kept in registers

// acc_i[16 * v0, 16 * (v0 + VC)) = acc_i * corr[i] + sum over j in [jlo, jhi) of p[i][j] * V[j]
// for the kRows rows i of a group, in increasing j (one FMA per row, vector and key).
// vf: (16, hd) fp32 values of the block.
template <int VC>
inline void PvChunk(const float* vf, int hd, int v0, int jlo, int jhi, const float (&p)[kRows][16],
                    const float (&corr)[kRows], float* const (&acc)[kRows]) {
  __m512 av[kRows][VC];
  for (int i = 0; i < kRows; ++i) {
    const __m512 c = _mm512_set1_ps(corr[i]);
    for (int c4 = 0; c4 < VC; ++c4)
      av[i][c4] = _mm512_mul_ps(_mm512_loadu_ps(acc[i] + 16 * (v0 + c4)), c);
  }
  for (int j = jlo; j < jhi; ++j) {
    const float* vj = vf + j * hd + 16 * v0;
    __m512 vv[VC];
    for (int c4 = 0; c4 < VC; ++c4) vv[c4] = _mm512_load_ps(vj + 16 * c4);
    for (int i = 0; i < kRows; ++i) {
      const __m512 pb = _mm512_set1_ps(p[i][j]);
      for (int c4 = 0; c4 < VC; ++c4) av[i][c4] = _mm512_fmadd_ps(pb, vv[c4], av[i][c4]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int c4 = 0; c4 < VC; ++c4) _mm512_storeu_ps(acc[i] + 16 * (v0 + c4), av[i][c4]);
  }
}

}  // namespace

// AVX-512 path for block_tokens == 16 and head_dim % 16 == 0 (<= 256): one block's 16 scores
// of a query row are one register (keys stored (head_dim, 16), so score = sum_d q[d] * K[d,:]).
void AttendTileAvx512(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride) {
  if (a.block_tokens != 16 || a.head_dim % 16 != 0) {
    AttendTileScalar(a, first_pos, n_tokens, q, q_stride, out, out_stride);
    return;
  }
  const int hd = a.head_dim, g = a.group;
  const int rows = n_tokens * g;
  const int nv = hd / 16;  // vectors per head row
  // (rows, head_dim) accumulators.
  thread_local std::vector<float> acc_buf;
  acc_buf.assign(static_cast<size_t>(rows) * hd, 0.0f);
  float* acc = acc_buf.data();
  alignas(64) float kf[kMaxAttentionHeadDim * 16];
  alignas(64) float vf[16 * kMaxAttentionHeadDim];
  AttentionRowState st[kMaxAttentionRows];
  for (int r = 0; r < rows; ++r) st[r] = {-INFINITY, 0.0f};
  const __m512 scale = _mm512_set1_ps(a.scale);
  const int last_key = LastKey(a, first_pos + n_tokens - 1);
  const int first_block = FirstVisibleBlock(a, first_pos);
  alignas(64) float dummy_acc[kMaxAttentionHeadDim] = {};  // for rows missing from a group
  for (int bi = first_block, start = first_block * 16; start <= last_key; start += 16, ++bi) {
    const uint16_t* kh = a.keys[bi];
    const uint16_t* vh = a.values[bi];
    const int n_block = std::min(16, last_key + 1 - start);
    for (int d = 0; d < hd; ++d) {
      _mm512_store_ps(
          kf + d * 16,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kh + d * 16))));
    }
    for (int i = 0; i < n_block * hd; i += 16) {
      _mm512_store_ps(
          vf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vh + i))));
    }
    // Rows in groups of kRows: each K and V vector loaded once feeds every row of the group,
    // and the group's rows are independent FMA chains. Every row still performs exactly the
    // operations of a row on its own (same order; a row outside the group's key range adds
    // p = 0, which leaves its sums unchanged), so results do not depend on the grouping.
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
      __m512 s0[kRows], s1[kRows];
      for (int i = 0; i < kRows; ++i) s0[i] = s1[i] = _mm512_setzero_ps();
      for (int d = 0; d < hd; d += 2) {
        const __m512 k0 = _mm512_load_ps(kf + d * 16);
        const __m512 k1 = _mm512_load_ps(kf + (d + 1) * 16);
        for (int i = 0; i < kRows; ++i) {
          s0[i] = _mm512_fmadd_ps(_mm512_set1_ps(qr[i][d]), k0, s0[i]);
          s1[i] = _mm512_fmadd_ps(_mm512_set1_ps(qr[i][d + 1]), k1, s1[i]);
        }
      }
      alignas(64) float pj[kRows][16];
      float corr[kRows];
      for (int i = 0; i < kRows; ++i) {
        if (!active[i]) {
          corr[i] = 1.0f;
          _mm512_store_ps(pj[i], _mm512_setzero_ps());
          continue;
        }
        const __mmask16 valid = static_cast<__mmask16>(((1u << n[i]) - 1) & ~((1u << j0[i]) - 1));
        const __m512 sc = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY),
                                               _mm512_mul_ps(_mm512_add_ps(s0[i], s1[i]), scale));
        AttentionRowState& state = st[r0 + i];
        const float m = std::max(state.max, _mm512_reduce_max_ps(sc));
        corr[i] = m == state.max ? 1.0f : std::exp(state.max - m);  // exp(0) is exactly 1
        const __m512 pv = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(sc, _mm512_set1_ps(m))));
        state = {m, state.sum * corr[i] + _mm512_reduce_add_ps(pv)};
        _mm512_store_ps(pj[i], pv);
      }
      // acc[row] = acc[row] * corr + sum_j p[row][j] * V[j], kVecs 16-wide vectors at a time.
      int v0 = 0;
      for (; v0 + kVecs <= nv; v0 += kVecs) PvChunk<kVecs>(vf, hd, v0, jlo, jhi, pj, corr, ar);
      for (; v0 < nv; ++v0) PvChunk<1>(vf, hd, v0, jlo, jhi, pj, corr, ar);
    }
  }
  StoreAttentionRows(a, acc, st, n_tokens, out, out_stride);
}

}  // namespace tandem::kernels::internal
