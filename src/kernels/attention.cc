// AttendTile: dispatch through the ISA table, and the portable path.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/fp16.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels {

void AttendTile(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                int64_t q_stride, float* out, int64_t out_stride) {
  internal::CurrentIsa()->attend_tile(a, first_pos, n_tokens, q, q_stride, out, out_stride);
}

namespace internal {

// Portable path. Keys of a block are stored (head_dim, block_tokens): k[d * bt + j].
void AttendTileScalar(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride) {
  const int hd = a.head_dim, bt = a.block_tokens, g = a.group;
  const int rows = n_tokens * g;
  thread_local std::vector<float> acc_buf;
  acc_buf.assign(static_cast<size_t>(rows) * hd, 0.0f);
  float* acc = acc_buf.data();
  AttentionRowState st[kMaxAttentionRows];
  for (int r = 0; r < rows; ++r) st[r] = {-INFINITY, 0.0f};
  thread_local std::vector<float> s, kf, vf;  // (bt), (hd, bt), (bt, hd) block scratch
  s.resize(bt);
  kf.resize(static_cast<size_t>(hd) * bt);
  vf.resize(static_cast<size_t>(bt) * hd);
  const int last_key = LastKey(a, first_pos + n_tokens - 1);
  const int first_block = FirstVisibleBlock(a, first_pos);
  for (int bi = first_block, start = first_block * bt; start <= last_key; start += bt, ++bi) {
    const uint16_t* kh = a.keys[bi];
    const uint16_t* vh = a.values[bi];
    const int n_block = std::min(bt, last_key + 1 - start);
    for (int i = 0; i < hd * bt; ++i) kf[i] = Fp16ToFp32(kh[i]);
    for (int i = 0; i < n_block * hd; ++i) vf[i] = Fp16ToFp32(vh[i]);
    for (int t = 0; t < n_tokens; ++t) {
      const int n = std::min(n_block, first_pos + t + 1 - start);  // causal
      const int j0 = std::max(0, RowKeyStart(a, first_pos + t) - start);
      if (n <= j0) continue;
      for (int gi = 0; gi < g; ++gi) {
        const int r = t * g + gi;
        const float* qr = q + t * q_stride + static_cast<int64_t>(gi) * hd;
        float m = st[r].max;
        for (int j = j0; j < n; ++j) {
          float dot = 0;
          for (int d = 0; d < hd; ++d) dot += qr[d] * kf[d * bt + j];
          s[j] = dot * a.scale;
          m = std::max(m, s[j]);
        }
        const float corr = std::exp(st[r].max - m);
        float sum = 0;
        float* ar = acc + r * hd;
        for (int d = 0; d < hd; ++d) ar[d] *= corr;
        for (int j = j0; j < n; ++j) {
          const float p = std::exp(s[j] - m);
          sum += p;
          for (int d = 0; d < hd; ++d) ar[d] += p * vf[j * hd + d];
        }
        st[r] = {m, st[r].sum * corr + sum};
      }
    }
  }
  StoreAttentionRows(a, acc, st, n_tokens, out, out_stride);
}

void StoreAttentionRows(const AttentionTile& a, const float* acc, const AttentionRowState* st,
                        int n_tokens, float* out, int64_t out_stride) {
  const int g = a.group, hd = a.head_dim;
  if (a.partial == nullptr) {
    NormalizeAttentionRows(n_tokens * g, g, hd, acc, st, out, out_stride);
    return;
  }
  for (int r = 0; r < n_tokens * g; ++r) {
    a.partial[r] = st[r];
    std::copy_n(acc + static_cast<int64_t>(r) * hd, hd,
                out + (r / g) * out_stride + static_cast<int64_t>(r % g) * hd);
  }
}

}  // namespace internal

void FoldAttentionPartial(int rows, int head_dim, const float* acc, const AttentionRowState* st,
                          float* run_acc, AttentionRowState* run_st) {
  for (int r = 0; r < rows; ++r) {
    const AttentionRowState s = st[r];
    AttentionRowState& run = run_st[r];
    const float* a = acc + static_cast<int64_t>(r) * head_dim;
    float* ra = run_acc + static_cast<int64_t>(r) * head_dim;
    if (s.sum == 0) continue;  // this range had no key for the row
    if (run.sum == 0) {        // nothing yet: take the range's result as it is
      run = s;
      std::copy_n(a, head_dim, ra);
      continue;
    }
    const float m = std::max(run.max, s.max);
    const float c_run = run.max == m ? 1.0f : std::exp(run.max - m);
    const float c_new = s.max == m ? 1.0f : std::exp(s.max - m);
    run = {m, run.sum * c_run + s.sum * c_new};
    for (int d = 0; d < head_dim; ++d) ra[d] = ra[d] * c_run + a[d] * c_new;
  }
}

void NormalizeAttentionRows(int rows, int group, int head_dim, const float* acc,
                            const AttentionRowState* st, float* out, int64_t out_stride) {
  for (int r = 0; r < rows; ++r) {
    float* o = out + (r / group) * out_stride + static_cast<int64_t>(r % group) * head_dim;
    const float inv = 1.0f / st[r].sum;
    for (int d = 0; d < head_dim; ++d) o[d] = acc[static_cast<int64_t>(r) * head_dim + d] * inv;
  }
}

}  // namespace tandem::kernels
