#include "cluster/mock_step.h"

#include <vector>

namespace tandem::cluster {

double MockStepSeconds(const conductor::CostModel& cost, std::span<const engine::BatchItem> batch) {
  int64_t decoding = 0, context = 0;
  std::vector<conductor::CostModel::Chunk> chunks;
  for (const engine::BatchItem& item : batch) {
    const auto n = static_cast<int64_t>(item.tokens.size());
    if (n == 1) {
      ++decoding;
      context += item.start_pos + 1;
    } else {
      chunks.push_back({n, item.start_pos});
    }
  }
  return cost.MixedStepSeconds(decoding, context, chunks);
}

std::function<double(std::span<const engine::BatchItem>)> MockStepFunction(
    conductor::CostModel cost) {
  return [cost = std::move(cost)](std::span<const engine::BatchItem> batch) {
    return MockStepSeconds(cost, batch);
  };
}

}  // namespace tandem::cluster
