#include "kernels/activations.h"

#include <cmath>

#include "kernels/isa_internal.h"

namespace tandem::kernels {

void SiluMulScalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void SiluMul(float* gate, const float* up, int64_t n) {
  internal::CurrentIsa()->silu_mul(gate, up, n);
}

}  // namespace tandem::kernels
