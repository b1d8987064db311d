#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu_isa.h"

namespace tandem::kernels {
namespace {

// The vector paths against the scalar reference; skipped, not passed, on a CPU without any,
// where it would compare the reference with itself.
TEST(ActivationsTest, VectorSiluMatchesScalar) {
  int compared = 0;
  for (const char* isa : {"avx2", "avx512"}) {
    ScopedIsa forced(isa);
    if (!forced.ok()) continue;
    ++compared;
    SCOPED_TRACE(isa);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-30.0f, 30.0f);
    for (int64_t n : {1, 15, 16, 17, 1000}) {
      std::vector<float> g(n), up(n);
      for (auto& x : g) x = u(rng);
      for (auto& x : up) x = u(rng) / 10;
      g[0] = -100.0f;  // exp overflow region
      std::vector<float> a = g, b = g;
      SiluMul(a.data(), up.data(), n);
      SiluMulScalar(b.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-6f * std::max(1.0f, std::fabs(b[i]))) << g[i];
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
}

// ExpSum (the sampler's softmax numerator): each element within the polynomial's 2e-7 relative
// error of the scalar exp, the sum within the same bound plus float accumulation over lanes
// (n * 2^-24 relative), and masked logits (-inf) give exactly 0.
TEST(ActivationsTest, VectorExpSumMatchesScalarAndZeroesMaskedLogits) {
  int compared = 0;
  for (const char* isa : {"avx2", "avx512"}) {
    ScopedIsa forced(isa);
    if (!forced.ok()) continue;
    ++compared;
    SCOPED_TRACE(isa);
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(-40.0f, 10.0f);
    for (int64_t n : {1, 7, 16, 33, 49152}) {
      std::vector<float> x(n);
      for (auto& v : x) v = u(rng);
      if (n > 2) {  // masked logits (the largest stays finite)
        x[0] = -std::numeric_limits<float>::infinity();
        x[n / 2] = -std::numeric_limits<float>::infinity();
      }
      const float shift = *std::max_element(x.begin(), x.end());
      std::vector<float> a(n), b(n);
      const double sa = ExpSum(x.data(), shift, 1.0f / 0.7f, a.data(), n);
      const double sb = ExpSumScalar(x.data(), shift, 1.0f / 0.7f, b.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(a[i], b[i], 3e-7f * b[i] + 1e-37f) << x[i];
      }
      if (n > 2) {
        EXPECT_EQ(a[0], 0.0f);
        EXPECT_EQ(a[n / 2], 0.0f);
      }
      EXPECT_NEAR(sa, sb, (3e-7 + n * 6e-8) * sb);
    }
  }
  if (compared == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
}

// GeluMul's definition: gelu of the fp16-rounded input, rounded to fp16, with the cut-offs at
// +-10; every path must give exactly this (llama.cpp's table semantics).
float GeluDefinition(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = Fp16ToFp32(Fp32ToFp16(x));
  const float g =
      0.5f * h *
      (1.0f + std::tanh(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
  return Fp16ToFp32(Fp32ToFp16(g));
}

// Runs check under every instruction set this CPU has (forced, then restored), traced by name;
// returns how many ran.
int ForEachIsa(const std::function<void(const char*)>& check) {
  int ran = 0;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    ScopedIsa forced(isa);
    if (!forced.ok()) continue;
    ++ran;
    SCOPED_TRACE(isa);
    check(isa);
  }
  return ran;
}

TEST(ActivationsTest, GeluMulIsExactOnEveryPath) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  const int64_t n = 1003;  // a vector tail too
  std::vector<float> g(n), up(n);
  for (auto& x : g) x = u(rng);
  for (auto& x : up) x = u(rng) / 4;
  g[0] = -10.0f, g[1] = 10.0f, g[2] = 0.0f, g[3] = -9.999f, g[4] = 9.999f, g[5] = 1e-8f;
  const int compared = ForEachIsa([&](const char*) {
    std::vector<float> a = g;
    GeluMul(a.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], GeluDefinition(g[i]) * up[i]) << g[i];
  });
  EXPECT_GE(compared, 1);
}

// Rounding to fp16 agrees bit for bit with the scalar converter the KV cache uses, on random
// values of every magnitude (fp16 subnormals, ties, overflow to infinity, NaN included).
TEST(ActivationsTest, RoundToFp16IsExactOnEveryPath) {
  std::mt19937 rng(5);
  std::vector<float> x(4099);  // a vector tail too
  for (auto& v : x) {
    uint32_t bits = static_cast<uint32_t>(rng());
    bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 60u) << 23);  // |x| in [2^-27, 2^33)
    std::memcpy(&v, &bits, sizeof(v));
  }
  x[0] = 65520.0f, x[1] = 65519.0f, x[2] = -0.0f, x[3] = 1.0f + 1.0f / 2048;  // inf, max, tie
  x[4] = std::nanf(""), x[5] = 5.9604645e-8f, x[6] = 2.9802322e-8f;           // NaN, subnormals
  const int compared = ForEachIsa([&](const char*) {
    std::vector<float> a = x;
    RoundToFp16(a.data(), static_cast<int64_t>(a.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = Fp16ToFp32(Fp32ToFp16(x[i]));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(a[i])) << i;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(want)) << x[i];
      }
    }
  });
  EXPECT_GE(compared, 1);
}

}  // namespace
}  // namespace tandem::kernels
