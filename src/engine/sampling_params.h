// The sampling settings of one request, apart from the sampler so that code which only carries
// them (the HTTP front door, the conductor, the worker protocol) does not pull in the engine.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace tandem::engine {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;       // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  uint64_t seed = 0;

  // InvalidArgument naming the bad field (negative temperature, top_p outside (0, 1], ...).
  Status Validate() const;
};

}  // namespace tandem::engine
