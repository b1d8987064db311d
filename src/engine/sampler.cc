#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/activations.h"

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

struct Candidate {
  int32_t id;
  float logit;
};

// A sampling thread's scratch, each vector up to vocab entries (reused across calls).
struct Scratch {
  std::vector<float> adjusted;        // logits after the adjustments
  std::vector<Candidate> candidates;  // (id, logit), partly sorted by the filters
  std::vector<float> probs;           // kept candidates' weights
  std::vector<float> kept_logits;     // kept candidates' logits
  std::vector<float> weights;         // by token id
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
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
  if (params_.logprobs >= 0) out = LogprobsOf(logits, out.token, params_.logprobs);
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
  Scratch& scratch = ThreadScratch();
  scratch.adjusted.assign(logits.begin(), logits.end());
  const auto in_vocab = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < logits.size();
  };
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) scratch.adjusted[id] += bias;
  }
  if (n_generated_ < params_.min_tokens) {
    for (int32_t id : masked_) {
      if (in_vocab(id)) scratch.adjusted[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const float rep = params_.repetition_penalty;
  auto repeat = [&](int32_t id) {
    float& l = scratch.adjusted[id];
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
    scratch.adjusted[id] -= params_.presence_penalty + params_.frequency_penalty * count;
  }
  return scratch.adjusted;
}

int32_t Sampler::Greedy(std::span<const float> logits) {
  Scratch& scratch = ThreadScratch();
  const int32_t best = Argmax(logits);
  if (Allowed(best)) return best;
  // In descending order (lowest id on ties): the first 64, then the rest.
  scratch.candidates.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    scratch.candidates[i] = {static_cast<int32_t>(i), logits[i]};
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  const size_t head = std::min<size_t>(64, scratch.candidates.size());
  std::partial_sort(scratch.candidates.begin(), scratch.candidates.begin() + head,
                    scratch.candidates.end(), by_logit);
  for (size_t i = 0; i < head; ++i) {
    if (Allowed(scratch.candidates[i].id)) return scratch.candidates[i].id;
  }
  std::sort(scratch.candidates.begin() + head, scratch.candidates.end(), by_logit);
  for (size_t i = head; i < scratch.candidates.size(); ++i) {
    if (Allowed(scratch.candidates[i].id)) return scratch.candidates[i].id;
  }
  return best;  // nothing is allowed (the constraint then lets only an end token through)
}

namespace {

// An index drawn with probability weights[i] / sum (sum: their total, > 0).
size_t DrawIndex(std::span<const float> weights, double sum, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, sum);
  double r = uniform(rng);
  size_t pick = weights.size() - 1;
  for (size_t i = 0; i < weights.size(); ++i) {
    r -= weights[i];
    if (r < 0) {
      pick = i;
      break;
    }
  }
  while (weights[pick] == 0 && pick > 0) --pick;  // rounding at the end of the range
  return pick;
}

}  // namespace

int32_t Sampler::Draw(std::span<const float> logits) {
  Scratch& scratch = ThreadScratch();
  if (params_.temperature <= 0.0f) return Greedy(logits);
  const float max_logit = logits[Argmax(logits)];
  const float inv_temperature = 1.0f / params_.temperature;
  // This draw's own generator: the same seed and position give the same draw wherever it runs.
  std::mt19937_64 rng(SplitMix64(params_.seed ^ SplitMix64(static_cast<uint64_t>(n_generated_))));
  const bool filtered = (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < logits.size()) ||
                        params_.top_p < 1.0f || params_.min_p > 0.0f;
  // After a refused draw: the same weights (by token id, only kept tokens non-zero) with what the
  // constraint refuses zeroed in one pass, and a draw again.
  auto redraw_allowed = [&]() -> int32_t {
    constraint_->Restrict(scratch.weights);
    double allowed_mass = 0;
    for (float w : scratch.weights) allowed_mass += w;
    if (allowed_mass > 0) {
      const size_t pick = DrawIndex(scratch.weights, allowed_mass, rng);
      if (scratch.weights[pick] > 0) return static_cast<int32_t>(pick);
    }
    return Greedy(logits);  // none of the kept tokens is allowed
  };
  if (!filtered) {
    // Every token is a candidate: weights straight from the logits, nothing sorted.
    scratch.weights.resize(logits.size());
    const double sum = kernels::ExpSum(logits.data(), max_logit, inv_temperature,
                                       scratch.weights.data(), logits.size());
    const size_t pick = DrawIndex(scratch.weights, sum, rng);
    if (Allowed(static_cast<int32_t>(pick))) return static_cast<int32_t>(pick);
    return redraw_allowed();
  }
  scratch.candidates.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    scratch.candidates[i] = {static_cast<int32_t>(i), logits[i]};
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  // Only what the filters need is sorted: the vocabulary is large (49k-262k) and a full sort
  // per token costs milliseconds.
  size_t n = scratch.candidates.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = params_.top_k;
    std::partial_sort(scratch.candidates.begin(), scratch.candidates.begin() + n,
                      scratch.candidates.end(), by_logit);
  }
  if (params_.top_p < 1.0f) {
    // Probabilities at temperature 1; the smallest most-likely prefix holding top_p of the mass,
    // sorting a growing head until it does.
    double total = 0;
    if (n == scratch.candidates.size()) {
      scratch.probs.resize(n);
      total = kernels::ExpSum(logits.data(), max_logit, 1.0f, scratch.probs.data(), n);
    } else {
      for (size_t i = 0; i < n; ++i) total += std::exp(scratch.candidates[i].logit - max_logit);
    }
    const bool sorted = n < scratch.candidates.size();  // top_k sorted the first n already
    size_t head = sorted ? n : std::min<size_t>(n, 64);
    size_t done = 0;
    double cumulative = 0;
    while (true) {
      if (!sorted) {
        std::partial_sort(scratch.candidates.begin() + done, scratch.candidates.begin() + head,
                          scratch.candidates.begin() + n, by_logit);
      }
      size_t i = done;
      for (; i < head; ++i) {
        cumulative += std::exp(scratch.candidates[i].logit - max_logit) / total;
        if (cumulative >= params_.top_p) break;
      }
      if (i < head) {
        n = i + 1;
        break;
      }
      if (head == n) break;  // the whole mass (rounding): keep everything
      done = head;
      head = std::min(n, head * 8);
    }
  }
  if (params_.min_p > 0.0f) {
    // Keep p >= min_p * p(most likely), i.e. logit >= max + log(min_p); order kept apart.
    const float floor = max_logit + std::log(params_.min_p);
    n = static_cast<size_t>(
        std::stable_partition(scratch.candidates.begin(), scratch.candidates.begin() + n,
                              [&](const Candidate& c) { return c.logit >= floor; }) -
        scratch.candidates.begin());
  }
  // Temperature, then a draw.
  scratch.probs.resize(n);
  scratch.kept_logits.resize(n);
  for (size_t i = 0; i < n; ++i) scratch.kept_logits[i] = scratch.candidates[i].logit;
  const double sum = kernels::ExpSum(scratch.kept_logits.data(), max_logit, inv_temperature,
                                     scratch.probs.data(), n);
  const size_t pick = DrawIndex(std::span(scratch.probs).first(n), sum, rng);
  if (Allowed(scratch.candidates[pick].id)) return scratch.candidates[pick].id;
  scratch.weights.assign(logits.size(), 0.0f);
  for (size_t i = 0; i < n; ++i) scratch.weights[scratch.candidates[i].id] = scratch.probs[i];
  return redraw_allowed();
}

SampledToken LogprobsOf(std::span<const float> raw, int32_t token, int top_n) {
  SampledToken out;
  out.token = token;
  // log p(t) = logit(t) - max - log(sum exp(logit - max)). Called per generated token and per
  // scored prompt position: the exponentials go through the vector kernel into a per-thread
  // buffer, and the top tokens are kept in a short sorted list (no vocabulary-sized sort).
  thread_local std::vector<float> exps;
  exps.resize(raw.size());
  const float max_logit = raw[Argmax(raw)];
  const double log_norm =
      max_logit + std::log(kernels::ExpSum(raw.data(), max_logit, 1.0f, exps.data(), raw.size()));
  auto logprob = [&](int32_t id) { return static_cast<float>(raw[id] - log_norm); };
  out.logprob = logprob(token);
  const size_t k = std::min<size_t>(std::max(top_n, 0), raw.size());
  if (k == 0) return out;
  // Descending by logit, lowest id first on ties (ids arrive ascending, so a tie never displaces).
  std::vector<int32_t> top;
  top.reserve(k + 1);
  for (size_t i = 0; i < raw.size(); ++i) {
    if (top.size() == k && raw[i] <= raw[top.back()]) continue;
    auto at = std::upper_bound(top.begin(), top.end(), raw[i],
                               [&](float v, int32_t id) { return v > raw[id]; });
    top.insert(at, static_cast<int32_t>(i));
    if (top.size() > k) top.pop_back();
  }
  out.top.reserve(k);
  for (int32_t id : top) out.top.push_back({id, logprob(id)});
  return out;
}

}  // namespace tandem::engine
