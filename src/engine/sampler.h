// Token sampling from a row of logits: greedy, or temperature with top-k, top-p and min-p
// filters, driven by a seeded generator so that the same seed gives the same tokens; with
// optional logit adjustments (bias, min_tokens, penalties) and log-probabilities.
//
// Order of the chain: the adjustments (SamplingParams: logit_bias, the min_tokens mask, the
// presence/frequency/repetition penalties), then (as llama.cpp's default) top-k, top-p, min-p,
// temperature and a draw. temperature <= 0 means greedy (argmax of the adjusted logits, lowest
// id on ties) and ignores the filters. Log-probabilities are those of the raw logits.
//
// With a TokenConstraint (structured output) only allowed tokens are drawn: greedy takes the
// most likely allowed token; sampling draws from the candidates the filters kept, redrawing
// without any that is not allowed (so it samples the kept distribution restricted to allowed
// tokens), and takes the most likely allowed token when none of the kept ones is.
//
// A draw depends only on the sequence's own logits, its own tokens, its seed and its position
// (each draw has its own generator, seeded from both), never on what else is in the batch
// (batch invariance) nor on how many redraws earlier draws needed.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/sampling_params.h"
#include "engine/token_constraint.h"

namespace tandem::engine {

// One per sequence; not thread-safe.
class Sampler {
 public:
  // `prompt`: the sequence's prompt (read by the repetition penalty; not kept otherwise).
  // `end_tokens`: the model's end-of-generation ids, masked with params.stop_token_ids while
  // fewer than params.min_tokens tokens were generated.
  // `constraint` (may be null): what the output must follow.
  explicit Sampler(const SamplingParams& params, std::span<const int32_t> prompt = {},
                   std::span<const int32_t> end_tokens = {},
                   std::unique_ptr<TokenConstraint> constraint = nullptr);

  // Draws the next token from one row of logits (vocab_size floats) and records it as generated.
  SampledToken Sample(std::span<const float> logits);

  // Records tokens drawn elsewhere (the prefill side of disaggregation, from the same params)
  // as if this sampler had drawn them: the penalties, min_tokens and the constraint count them,
  // so the continuation is what one place would draw.
  void Resume(std::span<const int32_t> generated);

  int generated() const { return n_generated_; }
  // The constraint is satisfied and nothing may follow: the request is done.
  bool ConstraintFinished() const { return constraint_ && constraint_->Finished(); }

 private:
  // The logits after the adjustments, in this thread's scratch (only called when
  // params_.AdjustsLogits()); valid until the thread's next Adjust.
  std::span<const float> Adjust(std::span<const float> logits);
  void Record(int32_t token);
  int32_t Draw(std::span<const float> logits);
  // The most likely token the constraint allows (any token without one).
  int32_t Greedy(std::span<const float> logits);
  bool Allowed(int32_t token) const { return !constraint_ || constraint_->Allows(token); }

  SamplingParams params_;
  std::unique_ptr<TokenConstraint> constraint_;
  int n_generated_ = 0;
  std::unordered_map<int32_t, int> output_counts_;  // generated token -> occurrences
  std::vector<int32_t> prompt_tokens_;              // distinct; only with a repetition penalty
  std::vector<int32_t> masked_;                     // end tokens masked before min_tokens
  // Vocabulary-sized scratch lives per thread (sampler.cc), not per sequence: one sequence's
  // would be about 24 bytes x vocab (6 MiB for a 262k vocabulary), times every running
  // sequence; per thread it is bounded by the threads that sample (engine::PlanMemory).
};

int32_t Argmax(std::span<const float> logits);

// The raw log-probability of `token` in one row of logits, and the top_n most likely tokens
// (top_n <= 0: none): what a prompt position reports for prompt logprobs.
SampledToken LogprobsOf(std::span<const float> logits, int32_t token, int top_n);

}  // namespace tandem::engine
