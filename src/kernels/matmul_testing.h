// Shared helpers of the MatMul tests: random problems with a double-precision reference, and
// the tolerance check (its derivation is in matmul_test.cc's header comment).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/matmul.h"

namespace tandem::kernels {

void PrintTo(DType t, std::ostream* os);

namespace test_util {

inline constexpr double kRelTol = 5e-5;

struct Problem {
  DType t;
  int64_t n, k, m;
  std::vector<uint8_t> w;          // n rows of RowBytes(t, k)
  std::vector<float> x;            // m x k activations
  std::vector<double> ref, scale;  // m x n reference outputs and their error scale S
};

// n x k Gaussian weights quantized to t, m x k Gaussian activations with a few outliers, and the
// reference outputs from the dequantized weights and the quantized-then-dequantized activations.
Problem MakeProblem(DType t, int64_t n, int64_t k, int64_t m, uint32_t seed);
// MatMul of p's weights (GGUF layout) and activations.
std::vector<float> RunMatMul(const Problem& p, ThreadPool* pool);
// Fails (up to 5 reports) where |y - want| > kRelTol * S + 1e-6.
void ExpectClose(const Problem& p, const std::vector<float>& y, const std::vector<double>& want,
                 const std::string& what);
// The ISAs this CPU can run ("scalar" always); leaves the detected one active.
std::vector<const char*> AvailableIsas();

}  // namespace test_util
}  // namespace tandem::kernels
