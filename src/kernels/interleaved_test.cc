// MatMul on interleaved (rows16) weights: against the double-precision reference on every ISA
// and thread count (tolerance as in matmul_test.cc), bit for bit the same on every ISA (the
// scalar path reproduces the AVX-512 arithmetic), independent of the batch, and mixable with
// GGUF-layout outputs in one MatMulShared call.
#include "kernels/interleaved.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"
#include "kernels/matmul_testing.h"

namespace tandem::kernels {
namespace {

using test_util::AvailableIsas;
using test_util::ExpectClose;
using test_util::MakeProblem;
using test_util::Problem;

WeightView Gguf(const Problem& p) { return WeightView{p.t, p.n, p.k, p.w.data()}; }

std::vector<float> Multiply(const WeightView& w, const float* x, int64_t m, ThreadPool* pool) {
  std::vector<float> y(m * w.rows, std::nanf(""));
  MatMul(w, x, m, y.data(), pool);
  return y;
}

class InterleavedTest : public ::testing::TestWithParam<DType> {
 protected:
  void TearDown() override { ForceIsa("auto"); }
};

TEST_P(InterleavedTest, MatchesReferenceOnEveryIsa) {
  const DType t = GetParam();
  ThreadPool pool2(2), pool3(3);
  uint32_t seed = 50;
  for (int64_t k : {32, 96, 576}) {
    for (int64_t n : {16, 48}) {
      for (int64_t m : {1, 3, 4, 5, 17}) {
        const Problem p = MakeProblem(t, n, k, m, seed++);
        const InterleavedMatrix im(Gguf(p));
        EXPECT_EQ(im.view().layout, WeightLayout::kRows16);
        for (const char* isa : AvailableIsas()) {
          ASSERT_TRUE(ForceIsa(isa));
          const std::string what = std::string(GetDTypeInfo(t).name) + " " + isa +
                                   " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                   " m=" + std::to_string(m);
          ExpectClose(p, Multiply(im.view(), p.x.data(), m, nullptr), p.ref, what + " 1 thread");
          ExpectClose(p, Multiply(im.view(), p.x.data(), m, &pool2), p.ref, what + " 2 threads");
          ExpectClose(p, Multiply(im.view(), p.x.data(), m, &pool3), p.ref, what + " 3 threads");
        }
      }
    }
  }
}

// Every ISA, thread count and batch gives each output bit for bit what the scalar path gives
// that activation row alone. 1,024 rows (threads split the panels, some unevenly) and 420
// activation rows (the AVX-512 path takes them in several L2-sized chunks).
TEST_P(InterleavedTest, BitIdenticalAcrossIsasThreadsAndBatches) {
  const DType t = GetParam();
  const Problem p = MakeProblem(t, 1024, 1088, 420, 60);
  const InterleavedMatrix im(Gguf(p));
  ASSERT_TRUE(ForceIsa("scalar"));
  ThreadPool pool3(3);
  const auto want = Multiply(im.view(), p.x.data(), p.m, &pool3);
  for (int64_t row : {0, 1, 211, 419}) {
    const auto alone = Multiply(im.view(), p.x.data() + row * p.k, 1, nullptr);
    ASSERT_EQ(0, std::memcmp(alone.data(), want.data() + row * p.n, p.n * sizeof(float)))
        << "scalar alone vs batch, row " << row;
  }
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      const auto batch = Multiply(im.view(), p.x.data(), p.m, &pool);
      ASSERT_EQ(0, std::memcmp(batch.data(), want.data(), want.size() * sizeof(float)))
          << isa << " batch of " << p.m << ", " << threads << " threads";
      for (int64_t m : {1, 2, 3, 4, 5}) {
        const auto part = Multiply(im.view(), p.x.data() + 7 * p.k, m, &pool);
        ASSERT_EQ(0, std::memcmp(part.data(), want.data() + 7 * p.n, part.size() * sizeof(float)))
            << isa << " m=" << m << ", " << threads << " threads";
      }
    }
  }
}

// Zero activations give exact zeros (no NaN from 0/0 scales).
TEST_P(InterleavedTest, ZeroActivations) {
  Problem p = MakeProblem(GetParam(), 32, 256, 2, 5);
  std::fill(p.x.begin(), p.x.end(), 0.0f);
  const InterleavedMatrix im(Gguf(p));
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    for (float v : Multiply(im.view(), p.x.data(), p.m, nullptr)) EXPECT_EQ(v, 0.0f) << isa;
  }
}

// Every row reads back from the interleaved copy exactly as from the GGUF rows.
TEST_P(InterleavedTest, RowsDequantizeAsInTheFile) {
  const Problem p = MakeProblem(GetParam(), 48, 96, 1, 90);
  const InterleavedMatrix im(Gguf(p));
  std::vector<float> want(p.k), got(p.k);
  for (int64_t r = 0; r < p.n; ++r) {
    DequantizeWeightRow(Gguf(p), r, want.data());
    DequantizeWeightRow(im.view(), r, got.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), p.k * sizeof(float))) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, InterleavedTest, ::testing::Values(DType::kQ4_1, DType::kQ8_0),
                         [](const auto& info) {
                           return std::string(GetDTypeInfo(info.param).name);
                         });

// One MatMulShared call over rows16 Q4_1, GGUF Q4_1 and rows16 Q8_0 outputs (two activation
// formats) gives each output exactly its own MatMul's result, including when the joint row
// range puts a panel boundary inside a thread's share (the GGUF output has 40 rows).
TEST(InterleavedSharedTest, EachOutputEqualsItsOwnMatMul) {
  constexpr int64_t k = 576;
  const Problem a = MakeProblem(DType::kQ4_1, 48, k, 5, 70);
  const Problem b = MakeProblem(DType::kQ4_1, 40, k, 1, 71);
  const Problem c = MakeProblem(DType::kQ8_0, 96, k, 1, 72);
  const InterleavedMatrix ia(Gguf(a)), ic(Gguf(c));
  const std::vector<WeightView> views = {ia.view(), Gguf(b), ic.view()};
  for (const char* isa : AvailableIsas()) {
    ASSERT_TRUE(ForceIsa(isa));
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (int64_t m : {int64_t{1}, int64_t{5}}) {
        std::vector<std::vector<float>> shared;
        std::vector<MatMulOutput> outs;
        for (const WeightView& w : views) {
          shared.emplace_back(m * w.rows, std::nanf(""));
          outs.push_back({w, shared.back().data()});
        }
        MatMulShared(outs, a.x.data(), m, &pool);
        for (size_t o = 0; o < views.size(); ++o) {
          const auto alone = Multiply(views[o], a.x.data(), m, &pool);
          ASSERT_EQ(0, std::memcmp(alone.data(), shared[o].data(), alone.size() * sizeof(float)))
              << isa << " output " << o << " m=" << m << " threads " << threads;
        }
      }
    }
  }
  ForceIsa("auto");
}

TEST(InterleavedShapeTest, OnlyQ4_1AndQ8_0WithWholePanels) {
  const Problem odd = MakeProblem(DType::kQ4_1, 20, 64, 1, 80);
  const Problem k4 = MakeProblem(DType::kQ4_K, 16, 256, 1, 81);
  EXPECT_FALSE(ShouldInterleave(Gguf(odd)));
  EXPECT_FALSE(ShouldInterleave(Gguf(k4)));
  EXPECT_DEATH(InterleavedMatrix{Gguf(odd)}, "cannot be interleaved");
  EXPECT_DEATH(InterleavedMatrix{Gguf(k4)}, "cannot be interleaved");
  const Problem ok = MakeProblem(DType::kQ8_0, 32, 64, 1, 82);
  const std::string isa = ActiveIsa();
  EXPECT_EQ(ShouldInterleave(Gguf(ok)), isa == "avx512" || isa == "amx") << isa;
}

}  // namespace
}  // namespace tandem::kernels
