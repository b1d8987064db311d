#include "engine/sampling_params.h"

#include <string>
#include <unordered_set>

namespace tandem::engine {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f) {
    return InvalidArgument("temperature must be in [0, 100], got " + std::to_string(temperature));
  }
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  for (auto [name, v] : {std::pair{"presence_penalty", presence_penalty},
                         std::pair{"frequency_penalty", frequency_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) {
      return InvalidArgument(std::string(name) + " must be in [-2, 2], got " + std::to_string(v));
    }
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f)) {
    return InvalidArgument("repetition_penalty must be in (0, 10], got " +
                           std::to_string(repetition_penalty));
  }
  std::unordered_set<int32_t> seen;
  for (const auto& [id, bias] : logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgument("logit_bias values must be in [-100, 100], got " +
                             std::to_string(bias) + " for token " + std::to_string(id));
    }
    if (!seen.insert(id).second) {
      return InvalidArgument("logit_bias names token " + std::to_string(id) + " twice");
    }
  }
  if (min_tokens < 0) {
    return InvalidArgument("min_tokens must be >= 0, got " + std::to_string(min_tokens));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs) {
    return InvalidArgument("prompt_logprobs must be in [0, " + std::to_string(kMaxLogprobs) +
                           "], got " + std::to_string(prompt_logprobs));
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return InvalidArgument("logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                           std::to_string(logprobs));
  }
  return OkStatus();
}

Status SamplingParams::ValidateTokens(int vocab_size) const {
  auto check = [&](int32_t id, const char* field) -> Status {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgument(std::string(field) + ": token id " + std::to_string(id) +
                             " is outside the vocabulary (size " + std::to_string(vocab_size) +
                             ")");
    }
    return OkStatus();
  };
  for (const auto& [id, bias] : logit_bias) TANDEM_RETURN_IF_ERROR(check(id, "logit_bias"));
  for (int32_t id : stop_token_ids) TANDEM_RETURN_IF_ERROR(check(id, "stop_token_ids"));
  return OkStatus();
}

bool SamplingParams::AdjustsLogits() const {
  return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
         !logit_bias.empty() || min_tokens > 0;
}

}  // namespace tandem::engine
