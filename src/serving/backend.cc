#include "serving/backend.h"

#include <algorithm>

namespace tandem::serving {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kTimeout: return "timeout";
  }
  return "unknown";
}

bool EndsGeneration(const GenerationRequest& request, int32_t token, bool end_of_generation) {
  const auto& ids = request.sampling.stop_token_ids;
  return (end_of_generation && !request.ignore_eos) ||
         std::find(ids.begin(), ids.end(), token) != ids.end();
}

Status ValidateRequest(const GenerationRequest& request, int vocab_size, int context_length) {
  const int64_t n_prompt = static_cast<int64_t>(request.prompt_tokens.size());
  if (n_prompt == 0) return InvalidArgument("the prompt has no tokens");
  if (request.max_tokens < 0 || (request.max_tokens == 0 && request.sampling.prompt_logprobs < 0)) {
    return InvalidArgument("max_tokens must be at least 1 (0 only with prompt logprobs)");
  }
  TANDEM_RETURN_IF_ERROR(request.sampling.Validate());
  TANDEM_RETURN_IF_ERROR(request.sampling.ValidateTokens(vocab_size));
  for (const auto* tokens : {&request.prompt_tokens, &request.resumed_output}) {
    for (int32_t t : *tokens) {
      if (t < 0 || t >= vocab_size) {
        return InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary");
      }
    }
  }
  const int64_t n_resumed = static_cast<int64_t>(request.resumed_output.size());
  if (n_resumed > 0 && (n_resumed >= request.max_tokens || request.sampling.prompt_logprobs >= 0)) {
    return InvalidArgument(
        "a resumed stream must have output left to draw, and no prompt logprobs");
  }
  if (n_prompt + n_resumed >= context_length) {
    return OutOfRange("the prompt has " + std::to_string(n_prompt) +
                      " tokens; the context length is " + std::to_string(context_length));
  }
  return OkStatus();
}

void AppendMemoryMetrics(const BackendStats& engine,
                         const std::vector<std::pair<std::string, std::string>>& labels,
                         std::vector<ExtraMetric>* out) {
  if (engine.memory_plan.empty()) return;
  for (const auto& [part, bytes] : engine.memory_plan) {
    auto l = labels;
    l.emplace_back("part", part);
    out->push_back({"tandem_worker_memory_plan_bytes",
                    "Memory an engine process plans for, by part (engine/memory_plan.h): "
                    "weights, kv, activations, logits, sampling, kv_pool, runtime.",
                    false, std::move(l), static_cast<double>(bytes)});
  }
  if (engine.memory_budget_bytes > 0) {
    out->push_back({"tandem_worker_memory_budget_bytes",
                    "The memory budget an engine process was sized to (--memory-budget-mb).", false,
                    labels, static_cast<double>(engine.memory_budget_bytes)});
  }
  out->push_back({"tandem_worker_resident_bytes", "Resident set of an engine process (VmRSS).",
                  false, labels, static_cast<double>(engine.resident_bytes)});
  out->push_back({"tandem_worker_peak_resident_bytes",
                  "Peak resident set of an engine process since it started (VmHWM): what its "
                  "memory plan bounds.",
                  false, labels, static_cast<double>(engine.peak_resident_bytes)});
}

}  // namespace tandem::serving
