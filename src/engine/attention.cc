#include "engine/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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
  const int n_ctx = pos + 1;
  const int n_blocks = (n_ctx + bt - 1) / bt;

  // Queries rounded to fp16, as the cache's keys are (llama.cpp multiplies fp16 by fp16).
  float qh[kMaxGroup * kMaxHeadDim];
  const float* qsrc = q + static_cast<size_t>(kv_head) * g * hd;
  for (int i = 0; i < g * hd; ++i) qh[i] = Fp16ToFp32(Fp32ToFp16(qsrc[i]));

  // Pass 1: scores of the whole context, block by block: s is (n_blocks, g, bt).
  thread_local std::vector<float> s;
  s.resize(static_cast<size_t>(n_blocks) * g * bt);
  for (int bi = 0; bi < n_blocks; ++bi) {
    const int n = std::min(bt, n_ctx - bi * bt);
    scores(qh, g, hd, a.kv->Keys(a.block_table[bi], a.layer, kv_head), n, a.scale,
           &s[static_cast<size_t>(bi) * g * bt]);
  }
  // Softmax per query head (sum in double), probabilities rounded to fp16 as llama.cpp feeds
  // them to its fp16 V product.
  for (int gi = 0; gi < g; ++gi) {
    float m = -INFINITY;
    for (int bi = 0; bi < n_blocks; ++bi) {
      const int n = std::min(bt, n_ctx - bi * bt);
      const float* sg = &s[static_cast<size_t>(bi) * g * bt + gi * n];
      for (int j = 0; j < n; ++j) m = std::max(m, sg[j]);
    }
    double sum = 0;
    for (int bi = 0; bi < n_blocks; ++bi) {
      const int n = std::min(bt, n_ctx - bi * bt);
      float* sg = &s[static_cast<size_t>(bi) * g * bt + gi * n];
      for (int j = 0; j < n; ++j) {
        sg[j] = std::exp(sg[j] - m);
        sum += sg[j];
      }
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int bi = 0; bi < n_blocks; ++bi) {
      const int n = std::min(bt, n_ctx - bi * bt);
      float* sg = &s[static_cast<size_t>(bi) * g * bt + gi * n];
      for (int j = 0; j < n; ++j) sg[j] = Fp16ToFp32(Fp32ToFp16(sg[j] * inv));
    }
  }
  // Pass 2: weighted sum of values.
  float* og = out + static_cast<size_t>(kv_head) * g * hd;
  std::fill(og, og + g * hd, 0.0f);
  for (int bi = 0; bi < n_blocks; ++bi) {
    const int n = std::min(bt, n_ctx - bi * bt);
    accumulate(&s[static_cast<size_t>(bi) * g * bt], g, hd,
               a.kv->Values(a.block_table[bi], a.layer, kv_head), n, og);
  }
}

}  // namespace tandem::engine
