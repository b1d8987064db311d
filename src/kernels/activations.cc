#include "kernels/activations.h"

#include <cmath>
#include <vector>

#include "common/fp16.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels {

void SiluMulScalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

namespace internal {

const float* GeluTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(1 << 16);
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    for (uint32_t h = 0; h < t.size(); ++h) {
      const float x = Fp16ToFp32(static_cast<uint16_t>(h));
      const float g = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
      t[h] = Fp16ToFp32(Fp32ToFp16(g));
    }
    return t;
  }();
  return table.data();
}

}  // namespace internal

void GeluMulScalar(float* gate, const float* up, int64_t n) {
  const float* table = internal::GeluTable();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : table[Fp32ToFp16(x)];
    gate[i] = g * up[i];
  }
}

void GeluMul(float* gate, const float* up, int64_t n) {
  internal::CurrentIsa()->gelu_mul(gate, up, n);
}

void SiluMul(float* gate, const float* up, int64_t n) {
  internal::CurrentIsa()->silu_mul(gate, up, n);
}

double ExpSumScalar(const float* x, float shift, float scale, float* out, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp((x[i] - shift) * scale);
    sum += out[i];
  }
  return sum;
}

double ExpSum(const float* x, float shift, float scale, float* out, int64_t n) {
  return internal::CurrentIsa()->exp_sum(x, shift, scale, out, n);
}

void RoundToFp16Scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
}

void RoundToFp16(float* x, int64_t n) { internal::CurrentIsa()->round_to_fp16(x, n); }

}  // namespace tandem::kernels
