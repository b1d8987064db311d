// Element-wise activations of the FFN, on the instruction set of kernels/cpu_isa.h.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], for i in [0, n).
// The vector path's exp has a relative error below 2e-7 (float rounding level).
void SiluMul(float* gate, const float* up, int64_t n);
// The portable reference (what the scalar table runs).
void SiluMulScalar(float* gate, const float* up, int64_t n);

// gate[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation,
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// evaluated as llama.cpp's CPU backend does: x <= -10 gives 0, x >= 10 gives x, otherwise
// gelu(fp16(x)) rounded to fp16 (a 65,536-entry table). Every path gives identical results.
void GeluMul(float* gate, const float* up, int64_t n);
void GeluMulScalar(float* gate, const float* up, int64_t n);

// out[i] = exp((x[i] - shift) * scale) for i in [0, n); returns the sum of out (accumulated in
// float per lane, then added in double). The softmax numerator of the sampler (shift: the
// largest x, scale: 1 / temperature). Vector paths: relative error below 2e-7 per element.
double ExpSum(const float* x, float shift, float scale, float* out, int64_t n);
double ExpSumScalar(const float* x, float shift, float scale, float* out, int64_t n);

// x[i] = fp32(fp16(x[i])) (round to nearest even, as common/fp16.h), for i in [0, n). Every
// path gives identical results.
void RoundToFp16(float* x, int64_t n);
void RoundToFp16Scalar(float* x, int64_t n);

}  // namespace tandem::kernels
