#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace tandem::engine {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return Argmax(logits);
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_[i] = {static_cast<int32_t>(i), logits[i]};
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Probabilities at temperature 1 for the top-p and min-p filters.
  const float max_logit = candidates_[0].logit;
  probs_.resize(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp(candidates_[i].logit - max_logit);
    total += probs_[i];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < n; ++i) {
      cumulative += probs_[i] / total;
      if (cumulative >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    // probs_[0] is the most likely candidate's unnormalised probability (= 1).
    size_t keep = 1;
    while (keep < n && probs_[keep] >= params_.min_p * probs_[0]) ++keep;
    n = keep;
  }
  // Temperature, then a draw.
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp((candidates_[i].logit - max_logit) / params_.temperature);
    sum += probs_[i];
  }
  std::uniform_real_distribution<double> uniform(0.0, sum);
  double r = uniform(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= probs_[i];
    if (r < 0) return candidates_[i].id;
  }
  return candidates_[n - 1].id;
}

}  // namespace tandem::engine

namespace tandem::engine {

void Sampler::Skip(int n) {
  // Greedy draws nothing; otherwise each Sample makes one uniform double draw, which takes one
  // 64-bit output of the generator (53 mantissa bits fit in one call).
  if (params_.temperature <= 0.0f || n <= 0) return;
  rng_.discard(static_cast<unsigned long long>(n));
}

}  // namespace tandem::engine
