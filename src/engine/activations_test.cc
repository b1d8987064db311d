#include "engine/activations.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::engine {
namespace {

TEST(ActivationsTest, VectorSiluMatchesScalar) {
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

}  // namespace
}  // namespace tandem::engine
