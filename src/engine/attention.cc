#include "engine/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/fp16.h"

namespace tandem::engine {
namespace {

constexpr int kMaxGroup = 16;  // query heads per kv head
constexpr int kMaxHeadDim = 256;

// Scores of `g` query vectors against n keys: s[gi * n + j] = scale * q_gi · k_j.
using ScoreFn = void (*)(const float* q, int g, int head_dim, const uint16_t* keys, int n,
                         float scale, float* s);
// acc_gi += sum_j p[gi * n + j] * v_j.
using AccumulateFn = void (*)(const float* p, int g, int head_dim, const uint16_t* values, int n,
                              float* acc);

void ScoresScalar(const float* q, int g, int hd, const uint16_t* keys, int n, float scale,
                  float* s) {
  float k[kMaxHeadDim];
  for (int j = 0; j < n; ++j) {
    for (int d = 0; d < hd; ++d) k[d] = Fp16ToFp32(keys[j * hd + d]);
    for (int gi = 0; gi < g; ++gi) {
      float dot = 0;
      for (int d = 0; d < hd; ++d) dot += q[gi * hd + d] * k[d];
      s[gi * n + j] = dot * scale;
    }
  }
}

void AccumulateScalar(const float* p, int g, int hd, const uint16_t* values, int n, float* acc) {
  float v[kMaxHeadDim];
  for (int j = 0; j < n; ++j) {
    for (int d = 0; d < hd; ++d) v[d] = Fp16ToFp32(values[j * hd + d]);
    for (int gi = 0; gi < g; ++gi) {
      const float w = p[gi * n + j];
      for (int d = 0; d < hd; ++d) acc[gi * hd + d] += w * v[d];
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// head_dim must be a multiple of 8 for the vector paths (checked by the dispatcher).
__attribute__((target("avx2,fma,f16c"))) void ScoresAvx2(const float* q, int g, int hd,
                                                         const uint16_t* keys, int n, float scale,
                                                         float* s) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* k = keys + j * hd;
    for (int gi = 0; gi < g; ++gi) {
      const float* qg = q + gi * hd;
      __m256 acc = _mm256_setzero_ps();
      for (int d = 0; d < hd; d += 8) {
        const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + d)));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + d), kv, acc);
      }
      s[gi * n + j] = HorizontalSum(acc) * scale;
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) void AccumulateAvx2(const float* p, int g, int hd,
                                                             const uint16_t* values, int n,
                                                             float* acc) {
  for (int j = 0; j < n; ++j) {
    const uint16_t* v = values + j * hd;
    for (int d = 0; d < hd; d += 8) {
      const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + d)));
      for (int gi = 0; gi < g; ++gi) {
        float* a = acc + gi * hd + d;
        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(p[gi * n + j]), vv, _mm256_loadu_ps(a)));
      }
    }
  }
}

bool UseAvx2Default() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool g_use_avx2 = UseAvx2Default();

}  // namespace

void SetAttentionIsa(const char* isa) {
  g_use_avx2 = std::string(isa) == "avx2" && UseAvx2Default();
}

void AttendOneToken(const AttentionArgs& a, int pos, int kv_head, const float* q, float* out) {
  const KvCacheShape& sh = a.kv->shape();
  const int hd = sh.head_dim;
  const int g = a.n_heads / sh.n_kv_heads;
  const int bt = sh.block_tokens;
  const bool vec = g_use_avx2 && hd % 8 == 0;
  const ScoreFn scores = vec ? ScoresAvx2 : ScoresScalar;
  const AccumulateFn accumulate = vec ? AccumulateAvx2 : AccumulateScalar;

  const float* qg = q + static_cast<size_t>(kv_head) * g * hd;
  float* og = out + static_cast<size_t>(kv_head) * g * hd;
  std::fill(og, og + g * hd, 0.0f);
  float running_max[kMaxGroup];
  float running_sum[kMaxGroup];
  std::fill(running_max, running_max + g, -INFINITY);
  std::fill(running_sum, running_sum + g, 0.0f);
  float s[kMaxGroup * 256];  // (g, bt) scores of one block; bt <= 256

  const int n_ctx = pos + 1;
  for (int start = 0, bi = 0; start < n_ctx; start += bt, ++bi) {
    const int32_t block = a.block_table[bi];
    const int n = std::min(bt, n_ctx - start);
    scores(qg, g, hd, a.kv->Keys(block, a.layer, kv_head), n, a.scale, s);
    for (int gi = 0; gi < g; ++gi) {
      float* sg = s + gi * n;
      float m = running_max[gi];
      for (int j = 0; j < n; ++j) m = std::max(m, sg[j]);
      const float correction = std::exp(running_max[gi] - m);
      float sum = 0;
      for (int j = 0; j < n; ++j) {
        sg[j] = std::exp(sg[j] - m);
        sum += sg[j];
      }
      running_sum[gi] = running_sum[gi] * correction + sum;
      running_max[gi] = m;
      if (correction != 1.0f) {
        for (int d = 0; d < hd; ++d) og[gi * hd + d] *= correction;
      }
    }
    accumulate(s, g, hd, a.kv->Values(block, a.layer, kv_head), n, og);
  }
  for (int gi = 0; gi < g; ++gi) {
    const float inv = 1.0f / running_sum[gi];
    for (int d = 0; d < hd; ++d) og[gi * hd + d] *= inv;
  }
}

}  // namespace tandem::engine
