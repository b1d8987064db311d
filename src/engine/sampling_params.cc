#include "engine/sampling_params.h"

#include <string>

namespace tandem::engine {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f) {
    return InvalidArgument("temperature must be in [0, 100], got " + std::to_string(temperature));
  }
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  return OkStatus();
}

}  // namespace tandem::engine
