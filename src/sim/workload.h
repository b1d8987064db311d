// The requests a simulation replays: a Mooncake trace (JSON lines with `timestamp` in ms,
// `input_length`, `output_length` and `hash_ids`, one id per 512-token prefix block, equal ids
// for equal content) at full scale or scaled, or a synthetic Poisson load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::sim {

struct SimRequest {
  int index = 0;         // position in the workload
  double arrival_s = 0;  // from the start of the run
  int input_tokens = 0;
  int output_tokens = 0;       // generated, the first (from the prefill) included; >= 1
  std::vector<uint64_t> keys;  // prefix keys of its blocks (block i stands for blocks 0..i)
};

struct TraceOptions {
  int start = 0;                 // first line used
  int max_requests = 0;          // 0: all
  double time_scale = 1.0;       // arrival times multiplied by this (0.5: twice the rate)
  double length_scale = 1.0;     // input and output lengths multiplied by this (>= 1 token)
  int trace_block_tokens = 512;  // tokens per hash id in the file
};

// Keys are the file's hash ids, salted by their position's prefix (so that a key stands for
// the whole prefix up to its block, as the engines' prefix keys do).
StatusOr<std::vector<SimRequest>> LoadTrace(const std::string& path, const TraceOptions& options);

struct SyntheticOptions {
  int requests = 100;
  double rate = 1.0;        // requests per second (Poisson arrivals)
  int input_tokens = 1024;  // mean; uniform in [mean (1 - range), mean (1 + range)]
  int output_tokens = 128;
  double range = 0.0;
  double shared_prefix = 0.0;  // share of each prompt that is one of `prefix_groups` prefixes
  int prefix_groups = 1;
  int block_tokens = 512;  // granularity of the keys
  uint64_t seed = 1;
};
std::vector<SimRequest> Synthetic(const SyntheticOptions& options);

// A load whose mix shifts: the phases one after another (each phase's first arrival one
// Poisson gap after the previous phase's last), indexed in order; phase k uses seed + k, and
// its prompts share nothing with other phases'.
std::vector<SimRequest> Phased(const std::vector<SyntheticOptions>& phases);

// "n=200,in=4096,out=32,rate=2;n=200,in=256,out=512,rate=4": phases of n requests, mean
// input and output tokens, Poisson rate (req/s); the other fields come from `base`.
// InvalidArgument naming the bad part.
StatusOr<std::vector<SyntheticOptions>> ParsePhases(const std::string& spec,
                                                    const SyntheticOptions& base);

// Block size (tokens) of the keys of a trace replayed at `length_scale`: the file's block
// scaled, at least 1.
int ScaledBlockTokens(const TraceOptions& options);

}  // namespace tandem::sim
