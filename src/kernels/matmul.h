// Quantized matrix multiply and row conversion on the CPU.
//
// Weights stay in their GGUF block format; activations are quantized once per call to the
// matching "dot" type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1, Q8_K for K-quants, F16/BF16/F32 kept
// as is), then dot products run over the blocks directly. Runtime dispatch (kernels/cpu_isa.h)
// picks AVX-512 or AVX2 code paths (scalar reference always available for tests).
//
// Numerics follow llama.cpp's CPU backend on x86: activation blocks are quantized exactly as its
// AVX2 quantizers do (Q8_0/Q8_1: d = amax/127 stored fp16, q = round-half-even(x * 127/amax),
// Q8_1 s = fp16(d * sum q); Q8_K: ggml's reference, see quant_blocks_internal.h), F16/BF16 weights
// see activations rounded to fp16/bf16, and integer block sums are exact. Results differ from
// llama.cpp's only by float summation order (~1e-6 relative).
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"  // ActiveIsa, ForceIsa: which path MatMul takes

namespace tandem::kernels {

// How a weight matrix's blocks are ordered in memory.
enum class WeightLayout : uint8_t {
  kGguf,    // row-major: row r is RowBytes(dtype, cols) bytes at r * RowBytes
  kRows16,  // rows interleaved 16 at a time (kernels/interleaved.h); Q4_1 and Q8_0 only
};

// A weight matrix of `rows` rows, each `cols` elements of `dtype` (RowBytes(dtype, cols) bytes a
// row), laid out as `layout` says. Not owned (usually points into the mmapped GGUF file, or
// into an InterleavedMatrix).
struct WeightView {
  DType dtype;
  int64_t rows;  // output features (n)
  int64_t cols;  // input features (k)
  const void* data;
  WeightLayout layout = WeightLayout::kGguf;
};

// y[m, rows] = x[m, cols] · W^T. x and y are row-major float32, y is overwritten.
// pool may be null (single-threaded). Thread-safe for distinct outputs.
// dtype must be a weight type (not Q8_1 / Q8_K) and cols a multiple of its block size; anything
// else aborts. Output rows are split across the pool's threads when each gets enough work
// (~256K multiply-adds); scratch memory is per thread and reused across calls.
void MatMul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool* pool);

// One product of a MatMulShared call: y[m, w.rows] = x[m, w.cols] · w^T, row-major, overwritten.
struct MatMulOutput {
  WeightView w;
  float* y;
};

// Several products of the same input x[m, cols] (every w.cols equal; at most kMaxSharedOutputs),
// such as a layer's Q, K and V or its gate and up projections. x is converted once per
// activation format, and the rows of all outputs are split across the pool's threads in one
// parallel region, which saves the per-call costs that dominate small decode matmuls. Every
// output row equals what MatMul gives for it, bit for bit (each row's dot products take the
// same path whatever rows share its call or its thread).
inline constexpr int kMaxSharedOutputs = 4;
void MatMulShared(std::span<const MatMulOutput> outs, const float* x, int64_t m, ThreadPool* pool);

// Dequantizes one row of n elements into dst (float32). Any DType, including Q8_1 / Q8_K.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Dequantizes row `row` of w (either layout) into dst[w.cols].
void DequantizeWeightRow(const WeightView& w, int64_t row, float* dst);

// Quantizes n float32 values into `t` blocks (all weight types above, for tests and for
// building GGUF files); n must be a multiple of the block size. Q4_0 / Q4_1 / Q5_0 follow ggml's
// reference quantizers; Q4_K / Q6_K use a simple scale choice (valid format, not llama.cpp's
// error-optimal search); Q8_0 / Q8_1 / Q8_K are the activation quantizers described above.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

}  // namespace tandem::kernels
