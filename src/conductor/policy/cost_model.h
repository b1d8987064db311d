// What one worker's engine costs, as fitted functions of the work: the conductor's predictions
// of TTFT and TBT are built from these. Pure data and arithmetic; no I/O besides JSON.
//
//   prefill_seconds(n new tokens after c cached) = p0 + p1 * n + p2 * n * (c + n / 2)
//       (the last term is attention: each new token attends to the cached ones and, on
//        average, half of the new ones)
//   decode_step_seconds(batch B, total context T) = d0 + d1 * B + d2 * T
//       (weights are read once per step: d0; per sequence: d1; KV read: d2 per context token)
//
// A profile is measured by the worker at start (cluster/calibration.h) or loaded from a file
// made by `tandem profile` or elsewhere (the simulator's GPU profiles use the same format).
// Units: seconds and tokens. Coefficients are >= 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace tandem::conductor {

struct CostModel {
  // Prefill: seconds = p0 + p1 * n + p2 * n * (c + n / 2).
  double prefill_base_s = 0;
  double prefill_per_token_s = 0;
  double prefill_attention_s = 0;  // per (new token x context token)
  // Decode step: seconds = d0 + d1 * batch + d2 * context_tokens.
  double decode_base_s = 0;
  double decode_per_seq_s = 0;
  double decode_per_context_token_s = 0;
  // What the profile was measured on (the key a saved profile is found under).
  std::string model;  // model file name
  int threads = 0;
  std::string cpu;     // e.g. the model name of /proc/cpuinfo
  std::string source;  // "calibrated", "file:<path>", ...

  bool valid() const { return prefill_per_token_s > 0 && decode_base_s > 0; }
  double PrefillSeconds(int64_t new_tokens, int64_t cached_tokens) const;
  // This model with its prefill coefficients times `prefill_factor` and its decode ones times
  // `decode_factor`.
  CostModel Scaled(double prefill_factor, double decode_factor) const;
  double DecodeStepSeconds(int64_t batch, int64_t context_tokens) const;
  // One fused forward pass of `batch` decoding sequences (holding context_tokens in all) and
  // prompt chunks: the chunks' matmuls run while the decode step reads the weights, so the step
  // pays the longer of d0 and the chunks' linear cost, then the rest of both:
  //   batch 0:  p0 + sum(p1 * n) + sum(p2 * n * (c + n / 2))
  //   else:     d1 * batch + d2 * context + max(d0, sum(p1 * n)) + sum(p2 * n * (c + n / 2))
  // (the simulator's and the mock worker's step time; 0 for an empty step).
  struct Chunk {
    int64_t new_tokens = 0;
    int64_t cached_tokens = 0;
  };
  double MixedStepSeconds(int64_t batch, int64_t context_tokens,
                          std::span<const Chunk> chunks) const;

  std::string ToJson() const;  // one object
  static StatusOr<CostModel> FromJson(const std::string& json);
};

// One measurement of a prefill: `new_tokens` computed after `cached_tokens` already in the
// cache, in `seconds`.
struct PrefillSample {
  int64_t new_tokens = 0;
  int64_t cached_tokens = 0;
  double seconds = 0;
};

// One measured decode step of `batch` sequences holding `context_tokens` tokens in all.
struct DecodeSample {
  int64_t batch = 0;
  int64_t context_tokens = 0;
  double seconds = 0;
};

// Least-squares fit of both formulas (coefficients constrained to >= 0: a coefficient the fit
// makes negative is dropped and the rest refitted). InvalidArgument with too few distinct
// samples (at least 3 of each).
StatusOr<CostModel> FitCostModel(std::span<const PrefillSample> prefill,
                                 std::span<const DecodeSample> decode);

}  // namespace tandem::conductor
