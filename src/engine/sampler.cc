#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace tandem::engine {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt,
                 std::span<const int32_t> end_tokens, std::unique_ptr<TokenConstraint> constraint)
    : params_(params), constraint_(std::move(constraint)) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                         prompt_tokens_.end());
  }
  if (params_.min_tokens > 0) {
    masked_.assign(end_tokens.begin(), end_tokens.end());
    masked_.insert(masked_.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
  }
}

SampledToken Sampler::Sample(std::span<const float> logits) {
  SampledToken out;
  out.token = Draw(params_.AdjustsLogits() ? Adjust(logits) : logits);
  if (params_.logprobs >= 0) FillLogprobs(logits, &out);
  Record(out.token);
  return out;
}

void Sampler::Resume(std::span<const int32_t> generated) {
  for (int32_t t : generated) Record(t);
}

void Sampler::Record(int32_t token) {
  ++n_generated_;
  if (constraint_) constraint_->Accept(token);
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f ||
      params_.repetition_penalty != 1.0f) {
    ++output_counts_[token];
  }
}

std::span<const float> Sampler::Adjust(std::span<const float> logits) {
  adjusted_.assign(logits.begin(), logits.end());
  const auto in_vocab = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < logits.size();
  };
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) adjusted_[id] += bias;
  }
  if (n_generated_ < params_.min_tokens) {
    for (int32_t id : masked_) {
      if (in_vocab(id)) adjusted_[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const float rep = params_.repetition_penalty;
  auto repeat = [&](int32_t id) {
    float& l = adjusted_[id];
    l = l > 0 ? l / rep : l * rep;
  };
  if (rep != 1.0f) {
    for (int32_t id : prompt_tokens_) {
      if (in_vocab(id)) repeat(id);
    }
  }
  for (const auto& [id, count] : output_counts_) {
    if (!in_vocab(id)) continue;
    // A token in the prompt was penalised for repetition above already.
    if (rep != 1.0f && !std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), id)) {
      repeat(id);
    }
    adjusted_[id] -= params_.presence_penalty + params_.frequency_penalty * count;
  }
  return adjusted_;
}

int32_t Sampler::Greedy(std::span<const float> logits) {
  const int32_t best = Argmax(logits);
  if (Allowed(best)) return best;
  // In descending order (lowest id on ties): the first 64, then the rest.
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_[i] = {static_cast<int32_t>(i), logits[i]};
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  const size_t head = std::min<size_t>(64, candidates_.size());
  std::partial_sort(candidates_.begin(), candidates_.begin() + head, candidates_.end(), by_logit);
  for (size_t i = 0; i < head; ++i) {
    if (Allowed(candidates_[i].id)) return candidates_[i].id;
  }
  std::sort(candidates_.begin() + head, candidates_.end(), by_logit);
  for (size_t i = head; i < candidates_.size(); ++i) {
    if (Allowed(candidates_[i].id)) return candidates_[i].id;
  }
  return best;  // nothing is allowed (the constraint then lets only an end token through)
}

int32_t Sampler::Draw(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return Greedy(logits);
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
  // This draw's own generator: the same seed and position give the same draw wherever it runs.
  std::mt19937_64 rng(SplitMix64(params_.seed ^ SplitMix64(static_cast<uint64_t>(n_generated_))));
  for (size_t tries = 0; tries < n && sum > 0; ++tries) {
    std::uniform_real_distribution<double> uniform(0.0, sum);
    double r = uniform(rng);
    size_t pick = n - 1;
    for (size_t i = 0; i < n; ++i) {
      r -= probs_[i];
      if (r < 0) {
        pick = i;
        break;
      }
    }
    while (probs_[pick] == 0 && pick > 0) --pick;  // rounding at the end of the range
    if (probs_[pick] == 0) break;
    if (Allowed(candidates_[pick].id)) return candidates_[pick].id;
    // Not allowed: draw again without it.
    sum -= probs_[pick];
    probs_[pick] = 0;
    if (!constraint_) break;
  }
  return Greedy(logits);
}

void Sampler::FillLogprobs(std::span<const float> raw, SampledToken* out) {
  // log p(t) = logit(t) - max - log(sum exp(logit - max)), in double for the sum.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : raw) max_logit = std::max(max_logit, l);
  double sum = 0;
  for (float l : raw) sum += std::exp(static_cast<double>(l - max_logit));
  const double log_norm = max_logit + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(raw[id] - log_norm); };
  out->logprob = logprob(out->token);
  const size_t k = std::min<size_t>(params_.logprobs, raw.size());
  if (k == 0) return;
  candidates_.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) candidates_[i] = {static_cast<int32_t>(i), raw[i]};
  std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(),
                    [](const Candidate& a, const Candidate& b) {
                      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                    });
  out->top.reserve(k);
  for (size_t i = 0; i < k; ++i)
    out->top.push_back({candidates_[i].id, logprob(candidates_[i].id)});
}

}  // namespace tandem::engine
