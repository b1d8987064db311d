#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu_isa.h"

namespace tandem::kernels {
namespace {

// The vector path against the scalar reference (only AVX-512 has one: the avx2 table runs the
// scalar SiLU); skipped, not passed, on a CPU without it, where it would compare the reference
// with itself.
TEST(ActivationsTest, VectorSiluMatchesScalar) {
  int compared = 0;
  for (const char* isa : {"avx512"}) {
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

}  // namespace
}  // namespace tandem::kernels
