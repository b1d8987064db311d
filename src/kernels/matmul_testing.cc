// Shared helpers of the MatMul tests (matmul_testing.h).
#include "kernels/matmul_testing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/fp16.h"
#include "kernels/cpu_isa.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels {

// Readable test parameter names in failure messages.
void PrintTo(DType t, std::ostream* os) { *os << GetDTypeInfo(t).name; }

namespace test_util {
namespace {

std::vector<float> Gaussian(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The activation as the kernels see it: quantized to the paired type and decoded.
std::vector<float> EffectiveActivation(DType t, const float* x, int64_t k) {
  std::vector<float> out(k);
  const DType at = ActType(t);
  if (at == DType::kF32) {
    out.assign(x, x + k);
  } else if (at == DType::kF16) {
    for (int64_t i = 0; i < k; ++i) out[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
  } else if (at == DType::kBF16) {
    for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToFp32(Fp32ToBf16(x[i]));
  } else {
    std::vector<uint8_t> q(RowBytes(at, k));
    QuantizeRow(at, x, q.data(), k);
    DequantizeRow(at, q.data(), out.data(), k);
  }
  return out;
}

}  // namespace

Problem MakeProblem(DType t, int64_t n, int64_t k, int64_t m, uint32_t seed) {
  Problem p{t, n, k, m, {}, Gaussian(m * k, seed + 1), {}, {}};
  const int64_t rb = RowBytes(t, k);
  p.w.resize(n * rb);
  const auto wf = Gaussian(n * k, seed);
  for (int64_t r = 0; r < n; ++r) QuantizeRow(t, wf.data() + r * k, p.w.data() + r * rb, k);
  for (int i = 0; i < 5 && i < m * k; ++i) p.x[(i * 7919) % (m * k)] *= 20;  // a few outliers

  std::vector<float> wd(n * k);
  for (int64_t r = 0; r < n; ++r) DequantizeRow(t, p.w.data() + r * rb, wd.data() + r * k, k);
  p.ref.assign(m * n, 0);
  p.scale.assign(m * n, 0);
  for (int64_t c = 0; c < m; ++c) {
    const auto a = EffectiveActivation(t, p.x.data() + c * k, k);
    std::vector<BlockQ8_1> a81(k / 32);
    if (t == DType::kQ4_1) QuantizeRow(DType::kQ8_1, p.x.data() + c * k, a81.data(), k);
    for (int64_t r = 0; r < n; ++r) {
      double s = 0, abs = 0;
      for (int64_t i = 0; i < k; ++i) {
        s += static_cast<double>(wd[r * k + i]) * a[i];
        abs += std::fabs(static_cast<double>(wd[r * k + i]) * a[i]);
      }
      if (t == DType::kQ4_1) {
        // ggml's Q4_1 dot uses the activation block sum s = fp16(d * sum q) for the min term
        // instead of sum(fp16(d) * q): swap one for the other.
        const auto* wb = reinterpret_cast<const BlockQ4_1*>(p.w.data() + r * rb);
        for (int64_t b = 0; b < k / 32; ++b) {
          double exact = 0;
          for (int j = 0; j < 32; ++j) exact += a[32 * b + j];
          const double mw = H2F(wb[b].m), sa = H2F(a81[b].s);
          s += mw * (sa - exact);
          abs += std::fabs(mw * sa);
        }
      }
      p.ref[c * n + r] = s;
      p.scale[c * n + r] = abs;
    }
  }
  return p;
}

std::vector<float> RunMatMul(const Problem& p, ThreadPool* pool) {
  std::vector<float> y(p.m * p.n, std::nanf(""));
  MatMul(WeightView{p.t, p.n, p.k, p.w.data()}, p.x.data(), p.m, y.data(), pool);
  return y;
}

void ExpectClose(const Problem& p, const std::vector<float>& y, const std::vector<double>& want,
                 const std::string& what) {
  int failures = 0;
  for (int64_t i = 0; i < p.m * p.n && failures < 5; ++i) {
    const double tol = kRelTol * p.scale[i] + 1e-6;
    if (!(std::fabs(y[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << " row " << i % p.n << " act " << i / p.n << ": got " << y[i]
                    << " want " << want[i] << " tol " << tol;
      ++failures;
    }
  }
}

std::vector<const char*> AvailableIsas() {
  std::vector<const char*> isas;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (ForceIsa(isa)) isas.push_back(isa);
  }
  ForceIsa("auto");
  return isas;
}

}  // namespace test_util
}  // namespace tandem::kernels
