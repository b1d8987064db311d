// MatMul tests: every weight type on every instruction set the CPU has, against a double
// precision reference built from the dequantized weights and the quantized-then-dequantized
// activations; odd shapes and several thread counts; vector paths against the scalar path.
//
// Tolerance: |y - ref| <= 5e-5 * S + 1e-6 with S = sum_i |w_i a_i| (plus |m * s| per block for
// Q4_1). The integer block sums are exact, so only float rounding of scales and accumulation
// remains (~1e-6 S); a wrong element, scale or block shows up as >= ~1/k of S. (The AVX-512 path
// stores offset weights unsigned and subtracts the offset per block, e.g. 16 d sum(q_a) for Q5_0:
// with Gaussian weights such a term is a few times that block's share of S, so its rounding is
// still ~1e-6 S.)
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/thread_pool.h"
#include "kernels/matmul_testing.h"

namespace tandem::kernels {
namespace {

using test_util::AvailableIsas;
using test_util::ExpectClose;
using test_util::MakeProblem;
using test_util::Problem;
using test_util::RunMatMul;

class MatMulTest : public ::testing::TestWithParam<DType> {
 protected:
  void TearDown() override { ForceIsa("auto"); }
};

// k values per type: multiples of the block size that exercise partial 128-element groups
// (AVX-512) and odd lengths for the float types.
std::vector<int64_t> Lengths(DType t) {
  switch (GetDTypeInfo(t).block_elems) {
    case 1: return {100, 576, 7};
    case 32: return {576, 96, 160, 1536};
    default: return {512, 256, 1536};
  }
}

TEST_P(MatMulTest, MatchesReferenceOnEveryIsa) {
  const DType t = GetParam();
  ThreadPool pool2(2), pool3(3);
  uint32_t seed = 10;
  for (int64_t k : Lengths(t)) {
    for (int64_t m : {1, 3, 17}) {
      const int64_t n = k >= 1536 ? 21 : 37;  // not a multiple of the 4-row tile or the grain
      const Problem p = MakeProblem(t, n, k, m, seed++);
      for (const char* isa : AvailableIsas()) {
        ASSERT_TRUE(ForceIsa(isa));
        const std::string what = std::string(GetDTypeInfo(t).name) + " " + isa +
                                 " k=" + std::to_string(k) + " m=" + std::to_string(m);
        ExpectClose(p, RunMatMul(p, nullptr), p.ref, what + " 1 thread");
        ExpectClose(p, RunMatMul(p, &pool2), p.ref, what + " 2 threads");
        ExpectClose(p, RunMatMul(p, &pool3), p.ref, what + " 3 threads");
      }
    }
  }
}

// Many output rows (threads split them) and enough activation rows that the vector paths
// process activations in several L2-sized chunks.
TEST_P(MatMulTest, LargeShapesAgreeAcrossIsas) {
  const DType t = GetParam();
  const int64_t k = GetDTypeInfo(t).block_elems == 256 ? 1024 : 1088;
  const Problem p = MakeProblem(t, 70, k, 420, 99);
  ThreadPool pool(3);
  ASSERT_TRUE(ForceIsa("scalar"));
  const auto ys = RunMatMul(p, &pool);
  ExpectClose(p, ys, p.ref, "scalar");
  const std::vector<double> scalar(ys.begin(), ys.end());
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    ExpectClose(p, RunMatMul(p, &pool), scalar, std::string(isa) + " vs scalar");
  }
}

// Decode shape with enough output rows that MatMul splits them across threads.
TEST_P(MatMulTest, SingleRowSplitAcrossThreads) {
  const DType t = GetParam();
  const Problem p = MakeProblem(t, 1000, 512, 1, 7);
  ThreadPool pool(3);
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    ExpectClose(p, RunMatMul(p, &pool), p.ref, std::string(isa) + " m=1 n=1000 3 threads");
  }
}

// Batch invariance: an activation row gives bit-identical outputs whether it is multiplied alone
// (decode) or among other rows (a batch), on every ISA and thread count. The serving loop relies
// on this so that batching and prefix caching never change generated text.
TEST_P(MatMulTest, RowResultsDoNotDependOnTheBatch) {
  const DType t = GetParam();
  const int64_t k = Lengths(t)[0];
  const Problem p = MakeProblem(t, 70, k, 37, 11);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const char* isa : AvailableIsas()) {
      ASSERT_TRUE(ForceIsa(isa));
      for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{37}}) {
        std::vector<float> batch(m * p.n);
        MatMul(WeightView{p.t, p.n, p.k, p.w.data()}, p.x.data(), m, batch.data(), &pool);
        for (int64_t row = 0; row < m; ++row) {
          std::vector<float> alone(p.n);
          MatMul(WeightView{p.t, p.n, p.k, p.w.data()}, p.x.data() + row * k, 1, alone.data(),
                 &pool);
          ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + row * p.n, p.n * sizeof(float)))
              << isa << " m=" << m << " row " << row << " threads " << threads;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTest,
                         ::testing::Values(DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0,
                                           DType::kQ4_K, DType::kQ6_K, DType::kF32, DType::kF16,
                                           DType::kBF16),
                         [](const auto& info) {
                           return std::string(GetDTypeInfo(info.param).name);
                         });

// MatMulShared (Q/K/V, gate/up in one call) gives every output exactly what MatMul gives it
// alone: mixed weight types (one activation conversion each), outputs of different heights whose
// rows the threads split unevenly, decode and batch shapes, every ISA and thread count.
TEST(MatMulSharedTest, EachOutputEqualsItsOwnMatMul) {
  constexpr int64_t k = 512;  // a multiple of every block size (Q4_K / Q6_K: 256)
  const Problem q = MakeProblem(DType::kQ4_K, 72, k, 9, 21);
  const Problem kk = MakeProblem(DType::kQ4_K, 24, k, 1, 22);
  const Problem v = MakeProblem(DType::kQ6_K, 40, k, 1, 23);
  const Problem u = MakeProblem(DType::kQ8_0, 300, k, 1, 24);
  const std::vector<float>& x = q.x;  // 9 activation rows shared by all four
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const char* isa : AvailableIsas()) {
      ASSERT_TRUE(ForceIsa(isa));
      for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{9}}) {
        std::vector<std::vector<float>> shared, alone;
        std::vector<MatMulOutput> outs;
        for (const Problem* p : {&q, &kk, &v, &u}) {
          shared.emplace_back(m * p->n, std::nanf(""));
          alone.emplace_back(m * p->n, std::nanf(""));
          const WeightView w{p->t, p->n, k, p->w.data()};
          outs.push_back({w, shared.back().data()});
          MatMul(w, x.data(), m, alone.back().data(), &pool);
        }
        MatMulShared(outs, x.data(), m, &pool);
        for (size_t o = 0; o < outs.size(); ++o) {
          ASSERT_EQ(0,
                    std::memcmp(alone[o].data(), shared[o].data(), alone[o].size() * sizeof(float)))
              << isa << " output " << o << " m=" << m << " threads " << threads;
        }
      }
    }
  }
}

TEST(MatMulSharedTest, DifferentWidthsAbort) {
  const Problem a = MakeProblem(DType::kQ8_0, 8, 64, 1, 31);
  const Problem b = MakeProblem(DType::kQ8_0, 8, 96, 1, 32);
  std::vector<float> ya(8), yb(8);
  const MatMulOutput outs[] = {{WeightView{a.t, a.n, a.k, a.w.data()}, ya.data()},
                               {WeightView{b.t, b.n, b.k, b.w.data()}, yb.data()}};
  EXPECT_DEATH(MatMulShared(outs, a.x.data(), 1, nullptr), "expected 64");
}

// Q5_0 on the shapes Gemma 3 270M gives it (attn_q 1024 x 640, attn_k 256 x 640, ffn_gate and
// ffn_up 2048 x 640), one instruction set per test so that a missing one skips only itself.
class MatMulQ5_0Test : public ::testing::TestWithParam<const char*> {};

TEST_P(MatMulQ5_0Test, GemmaShapesMatchReference) {
  ScopedIsa isa(GetParam());
  if (!isa.ok()) GTEST_SKIP() << "CPU lacks " << GetParam();
  ThreadPool pool(2);
  uint32_t seed = 40;
  for (int64_t n : {256, 1024, 2048}) {
    for (int64_t m : {1, 5}) {
      const Problem p = MakeProblem(DType::kQ5_0, n, 640, m, seed++);
      const std::string what =
          std::string(GetParam()) + " n=" + std::to_string(n) + " m=" + std::to_string(m);
      ExpectClose(p, RunMatMul(p, nullptr), p.ref, what);
      ExpectClose(p, RunMatMul(p, &pool), p.ref, what + " 2 threads");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, MatMulQ5_0Test, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const auto& info) { return std::string(info.param); });

TEST(MatMulIsaTest, ForceAndReport) {
  EXPECT_FALSE(ForceIsa("sse9"));
  ASSERT_TRUE(ForceIsa("scalar"));
  EXPECT_STREQ(ActiveIsa(), "scalar");
  ASSERT_TRUE(ForceIsa("auto"));
  const std::string detected = ActiveIsa();
  EXPECT_TRUE(detected == "scalar" || detected == "avx2" || detected == "avx512" ||
              detected == "amx")
      << detected;
}

// Zero activations and an all-zero block give exact zeros (no NaN from 0/0 scales).
TEST(MatMulIsaTest, ZeroActivations) {
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    for (DType t : {DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ8_0, DType::kQ6_K}) {
      Problem p = MakeProblem(t, 8, 256, 2, 5);
      std::fill(p.x.begin(), p.x.end(), 0.0f);
      for (float v : RunMatMul(p, nullptr))
        EXPECT_EQ(v, 0.0f) << isa << " " << GetDTypeInfo(t).name;
    }
  }
  ForceIsa("auto");
}

}  // namespace
}  // namespace tandem::kernels
