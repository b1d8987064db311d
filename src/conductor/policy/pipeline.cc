#include "conductor/policy/pipeline.h"

#include <algorithm>
#include <limits>

namespace tandem::conductor {

int PipelineChunkTokens(int64_t n_tokens, int max_chunk) {
  const int64_t even = (n_tokens + kMinPipelineChunks - 1) / kMinPipelineChunks;
  const int64_t rounded = (even + 15) / 16 * 16;
  return static_cast<int>(
      std::min<int64_t>(max_chunk, std::max<int64_t>(kMinPipelineChunkTokens, rounded)));
}

std::vector<double> LayerSeconds(const CostModel& cost, int n_layers,
                                 std::span<const int> layer_windows, int64_t n_tokens) {
  std::vector<double> out(n_layers, 0.0);
  if (n_layers <= 0) return out;
  const double n = static_cast<double>(n_tokens);
  for (int l = 0; l < n_layers; ++l) {
    const int window = l < static_cast<int>(layer_windows.size()) ? layer_windows[l] : 0;
    // sum over p < n of min(p + 1, W): n(n+1)/2 up to the window, then W per position.
    double pairs = n * (n + 1) / 2;
    if (window > 0 && n > window) {
      const double w = window;
      pairs = w * (w + 1) / 2 + (n - w) * w;
    }
    out[l] = (cost.prefill_per_token_s * n + cost.prefill_attention_s * pairs) / n_layers;
  }
  return out;
}

LayerSplit SplitLayers(const CostModel& cost, int n_layers, std::span<const int> layer_windows,
                       int64_t n_tokens, int stages, int chunk_tokens) {
  LayerSplit split;
  stages = std::clamp(stages, 1, std::max(1, n_layers));
  const std::vector<double> per_layer = LayerSeconds(cost, n_layers, layer_windows, n_tokens);
  std::vector<double> prefix(n_layers + 1, 0.0);
  for (int l = 0; l < n_layers; ++l) prefix[l + 1] = prefix[l] + per_layer[l];
  auto range = [&](int a, int b) { return prefix[b] - prefix[a]; };
  // best[k][l]: the smallest slowest-stage time of the first l layers in k stages; from[k][l]:
  // where its last stage starts.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n_layers + 1, kInf));
  std::vector<std::vector<int>> from(stages + 1, std::vector<int>(n_layers + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int l = k; l <= n_layers; ++l) {
      for (int start = k - 1; start < l; ++start) {
        const double v = std::max(best[k - 1][start], range(start, l));
        if (v < best[k][l]) {
          best[k][l] = v;
          from[k][l] = start;
        }
      }
    }
  }
  split.bounds.assign(stages + 1, n_layers);
  for (int k = stages, l = n_layers; k > 0; --k) {
    split.bounds[k] = l;
    l = from[k][l];
    split.bounds[k - 1] = l;
  }
  double slowest = 0;
  for (int k = 0; k < stages; ++k) {
    split.stage_seconds.push_back(range(split.bounds[k], split.bounds[k + 1]));
    slowest = std::max(slowest, split.stage_seconds.back());
  }
  split.single_seconds = prefix[n_layers] + cost.prefill_base_s;
  const double chunks =
      std::max<double>(1.0, static_cast<double>(n_tokens) / std::max(1, chunk_tokens));
  split.pipelined_seconds = slowest + (prefix[n_layers] - slowest) / chunks + cost.prefill_base_s;
  return split;
}

}  // namespace tandem::conductor
