// Quantized matrix multiply and row conversion on the CPU.
//
// Weights stay in their GGUF block format; activations are quantized once per call to the
// matching "dot" type (Q8_0 for Q4_0/Q8_0, Q8_1 for Q4_1, Q8_K for K-quants, F16/BF16/F32 kept
// as is), then dot products run over the blocks directly. Runtime dispatch picks AVX-512 or AVX2
// code paths (scalar reference always available for tests).
#pragma once

#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/types.h"

namespace tandem::kernels {

// A row-major weight matrix of `rows` rows, each `cols` elements of `dtype` packed in
// RowBytes(dtype, cols) bytes. Not owned (usually points into the mmapped GGUF file).
struct WeightView {
  DType dtype;
  int64_t rows;  // output features (n)
  int64_t cols;  // input features (k)
  const void* data;
};

// y[m, rows] = x[m, cols] · W^T. x and y are row-major float32, y is overwritten.
// pool may be null (single-threaded). Thread-safe for distinct outputs.
void MatMul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool* pool);

// Dequantizes one row of n elements into dst (float32).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes n float32 values into `t` blocks (all weight types above, for tests and for
// building GGUF files); n must be a multiple of the block size.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// Which vector instruction set MatMul uses: "avx512", "avx2" or "scalar".
const char* ActiveIsa();
// Forces an instruction set (for tests and benchmarks); returns false if the CPU lacks it.
bool ForceIsa(const char* isa);

}  // namespace tandem::kernels
