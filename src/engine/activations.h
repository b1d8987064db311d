// Element-wise activations of the FFN, vectorised where the CPU allows.
#pragma once

#include <cstdint>

namespace tandem::engine {

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], for i in [0, n).
// The vector path's exp has a relative error below 2e-7 (float rounding level).
void SiluMul(float* gate, const float* up, int64_t n);
void SiluMulScalar(float* gate, const float* up, int64_t n);

}  // namespace tandem::engine
