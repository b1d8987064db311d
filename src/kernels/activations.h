// Element-wise activations of the FFN, on the instruction set of kernels/cpu_isa.h.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], for i in [0, n).
// The vector path's exp has a relative error below 2e-7 (float rounding level).
void SiluMul(float* gate, const float* up, int64_t n);
// The portable reference (what the scalar table runs).
void SiluMulScalar(float* gate, const float* up, int64_t n);

}  // namespace tandem::kernels
