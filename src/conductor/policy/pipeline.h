// Chunked pipeline-parallel prefill (Mooncake's CPP), the conductor's part: how to split a
// model's layers between the prefill workers of a pipeline so that its stages take about the
// same time. A pure function of the cost model and the model's layer kinds.
//
// Per layer, a prefill of n new tokens from position 0 costs (cost_model.h, its per-token and
// attention terms shared equally by the L layers):
//   p1 / L * n                         (matmuls)
//   p2 / L * sum over p < n of min(p + 1, W)   (attention; W = the layer's window, or n)
// so that at 32k tokens a global layer of Gemma 3 costs several times a sliding one, and an
// even split of the layer count would leave one stage with most of the time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "conductor/policy/cost_model.h"

namespace tandem::conductor {

struct PipelineOptions {
  int min_tokens = 0;       // uncached prompt tokens from which a prefill is pipelined (0: never)
  int max_stages = 2;       // prefill workers of one pipeline at most
  int chunk_tokens = 1024;  // positions per chunk flowing through the stages, at most
};

struct LayerSplit {
  std::vector<int> bounds;  // stages + 1 layer indices: stage i runs [bounds[i], bounds[i+1])
  std::vector<double> stage_seconds;  // predicted compute of each stage
  double single_seconds = 0;          // the whole prefill on one worker
  // The pipeline's predicted time: the slowest stage, plus the other stages' share of the first
  // and last chunks (filling and draining the pipeline).
  double pipelined_seconds = 0;
};

// The chunk a pipeline of a prompt of n_tokens uses: max_chunk, or less for a shorter prompt so
// that it has at least kMinPipelineChunks chunks (filling and draining a pipeline of C chunks
// costs about 1/C of the work of the stages that wait), never below kMinPipelineChunkTokens
// (a step's fixed costs), a multiple of 16.
inline constexpr int kMinPipelineChunks = 16;
inline constexpr int kMinPipelineChunkTokens = 128;
int PipelineChunkTokens(int64_t n_tokens, int max_chunk);

// Predicted seconds of each layer for a prefill of n_tokens new tokens from position 0.
// layer_windows: per layer its attention window, 0 for full attention (empty: all full).
std::vector<double> LayerSeconds(const CostModel& cost, int n_layers,
                                 std::span<const int> layer_windows, int64_t n_tokens);

// Contiguous ranges of layers for `stages` stages (1 <= stages <= n_layers) minimising the
// slowest stage's predicted time, for chunks of chunk_tokens positions.
LayerSplit SplitLayers(const CostModel& cost, int n_layers, std::span<const int> layer_windows,
                       int64_t n_tokens, int stages, int chunk_tokens);

}  // namespace tandem::conductor
