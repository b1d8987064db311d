// Token sampling from a row of logits: greedy, or temperature with top-k, top-p and min-p
// filters, driven by a seeded generator so that the same seed gives the same tokens.
//
// Order of the chain (as llama.cpp's default): top-k, top-p, min-p, then temperature, then a
// draw. temperature <= 0 means greedy (argmax, lowest id on ties) and ignores the filters.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/sampling_params.h"

namespace tandem::engine {

// One per sequence; not thread-safe.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t Sample(std::span<const float> logits);
  // Advances the generator as `n` Sample calls would, so that a sequence continued elsewhere
  // (the decode side of disaggregation) draws what it would have drawn in one place.
  void Skip(int n);

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // scratch
  std::vector<float> probs_;           // scratch
};

int32_t Argmax(std::span<const float> logits);

}  // namespace tandem::engine
