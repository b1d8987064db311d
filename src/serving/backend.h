// The boundary between the HTTP front door and whatever generates tokens (the in-process
// continuous-batching scheduler now; remote prefill/decode workers later).
//
// The front door tokenizes, validates and submits a GenerationRequest with a sink; the backend
// calls the sink from its own thread as tokens are produced and exactly once at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/histogram.h"
#include "common/status.h"
#include "engine/sampling_params.h"

namespace tandem::serving {

using Clock = std::chrono::steady_clock;

struct GenerationRequest {
  std::string id;                      // unique, e.g. "cmpl-..."; used in logs
  std::vector<int32_t> prompt_tokens;  // non-empty
  int max_tokens = 16;                 // >= 1
  engine::SamplingParams sampling;
  bool ignore_eos = false;
  // Service-level objectives of this request (0: the server's defaults, if any). The conductor
  // rejects a request it predicts would miss them, and counts those it misses.
  double slo_ttft_seconds = 0;  // time to first token
  double slo_tbt_seconds = 0;   // time between tokens (mean over the stream)
  // Tokens this request already generated elsewhere (a stream moved off a failed decode
  // worker): computed as context after the prompt and counted as output by the sampler
  // (penalties, min_tokens, the constraint, each draw's seed position), so the continuation is
  // what the first worker would have drawn. max_tokens counts them; the sink sees what follows.
  std::vector<int32_t> resumed_output;
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();  // the request fails after this
};

// Whether `token` ends the request: one of its stop_token_ids, or an end-of-generation token of
// the model (`end_of_generation`) unless ignore_eos.
bool EndsGeneration(const GenerationRequest& request, int32_t token, bool end_of_generation);

// FinishInfo::message of a request that ran out of its own time (its deadline), as opposed to a
// shorter limit inside it.
inline constexpr const char* kRequestDeadlinePassed = "the request deadline passed";

enum class FinishReason { kStop, kLength, kCancelled, kError, kTimeout };
const char* FinishReasonName(FinishReason r);  // "stop", "length", "cancelled", "error", "timeout"

struct FinishInfo {
  FinishReason reason = FinishReason::kLength;
  std::string message;  // for kError / kTimeout
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // served from the prefix cache
  double queue_seconds = 0;      // arrival -> first scheduled
  double ttft_seconds = 0;       // arrival -> first token
  double total_seconds = 0;      // arrival -> finish
  // Disaggregated requests only (negative otherwise): the parts of the TTFT after queueing.
  double prefill_seconds = -1;       // prefill worker: first scheduled -> first token, minus
                                     // the transfer tail (steps shared with other prompts count)
  double kv_transfer_seconds = -1;   // KV still moving after the last layer was computed
  double first_decode_seconds = -1;  // KV landed -> first decode step done on the decode side
};

// Receives one request's output. Called from the backend's thread, never concurrently for the
// same sink. OnToken returning false cancels the request (client gone, stop string matched);
// OnFinish is then still called once, with kCancelled or the reason the caller set. A token's
// logprob and alternatives are filled when the request's sampling.logprobs >= 0.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual bool OnToken(const engine::SampledToken& token) = 0;
  // With sampling.prompt_logprobs >= 0: once, before the first token (or the end), the prompt's
  // tokens 1..n-1 with their logprobs given the tokens before them.
  virtual void OnPromptLogprobs(std::vector<engine::SampledToken> /*tokens*/) {}
  virtual void OnFinish(const FinishInfo& info) = 0;
};

// A backend-specific figure exposed as it is in /metrics (e.g. the disaggregated backend's
// transfer failures, or workers alive per role).
struct ExtraMetric {
  std::string name;  // Prometheus name, "tandem_..."
  std::string help;
  bool counter = false;  // counter (cumulative) or gauge
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// Help texts of the per-worker utilisation families of /metrics (labels worker, role and, for
// the first three, phase = prefill | decode), shared by the colocated server and the conductor.
inline constexpr const char* kBusySecondsHelp =
    "Wall seconds of the worker's forward passes; a step's time is split between its prompt and "
    "decode tokens by count.";
inline constexpr const char* kBusyCoreSecondsHelp =
    "Core seconds of the worker's forward passes: each pass's wall seconds times the threads it "
    "ran on (the thread count changes when elastic pools resize the worker), split by phase as "
    "the busy seconds are.";
inline constexpr const char* kComputedTokensHelp =
    "Tokens the worker's engine computed, by phase (a recomputed token counts as prefill).";
inline constexpr const char* kThreadsHelp = "Engine threads of the worker (cores it computes on).";
inline constexpr const char* kSamplingSecondsHelp =
    "Wall seconds the worker spent drawing tokens from logits (penalties, logit_bias, structured "
    "output constraints, logprobs), outside the forward passes.";

// A backend-specific histogram exposed as it is in /metrics.
struct ExtraHistogram {
  std::string name;  // Prometheus name, "tandem_..."
  std::string help;
  Histogram::Snapshot snapshot;
};

struct BackendStats {
  int running = 0;
  int waiting = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;    // held by running or waiting sequences
  int kv_blocks_cached = 0;  // held only by the prefix cache: reusable, evicted on demand
  // Sliding-window models: the window arena that holds the sliding layers' KV (0 otherwise).
  int kv_window_blocks_total = 0;
  int kv_window_blocks_used = 0;
  int64_t prefix_cache_hit_tokens = 0;  // cumulative, from the local cache or the KV pool
  int64_t pool_hit_tokens = 0;          // cumulative, the part read from the KV pool
  int64_t prompt_tokens = 0;            // cumulative, computed (not cached)
  int64_t generated_tokens = 0;         // cumulative
  int64_t preemptions = 0;              // cumulative
  // Cumulative tokens of preempted sequences: the KV offered to the KV pool at preemption, and
  // how each preempted token came back when its sequence resumed: from the local prefix cache,
  // from the KV pool, or recomputed.
  int64_t preempt_offloaded_tokens = 0;
  int64_t preempt_resumed_cache_tokens = 0;
  int64_t preempt_resumed_pool_tokens = 0;
  int64_t preempt_recomputed_tokens = 0;
  // Cumulative: admissions that did not read the KV pool because computing a block was
  // measured cheaper than fetching it (LocalBackend).
  int64_t pool_fetches_skipped = 0;
  // Cumulative, sliding-window models: pool reads given up because the windows behind the
  // prefix's end could not be read (held when asked, gone or no window storage when read).
  int64_t pool_window_misses = 0;
  int reserved_blocks = 0;           // decode side: held for KV being transferred in
  int64_t reservations_expired = 0;  // cumulative: reserved, never claimed, freed
  // Utilisation of one engine (0 where the backend is not one engine, e.g. the conductor):
  // cumulative wall seconds of its forward passes, each step's time split between its prompt
  // tokens and its decode tokens in proportion to their counts (a row of a batched matmul costs
  // the same whichever it is); the tokens of each phase (a decode token is one generated token
  // fed back; a recomputed one after preemption counts as prefill); the engine's threads.
  double busy_seconds_prefill = 0;
  double busy_seconds_decode = 0;
  // The same times the threads each pass ran on (the engine's thread count can change at
  // runtime: elastic pools), i.e. the cores it kept busy.
  double busy_core_seconds_prefill = 0;
  double busy_core_seconds_decode = 0;
  int64_t computed_tokens_prefill = 0;
  int64_t computed_tokens_decode = 0;
  int engine_threads = 0;       // now
  int engine_max_threads = 0;   // what it may be resized to
  double sampling_seconds = 0;  // cumulative, drawing tokens from logits (after the forward)
  // The engine process's memory (0 / empty where the backend is not one engine): its plan
  // (engine/memory_plan.h) part by part, the budget it was sized to (0: none given), and its
  // resident set now and at its peak (common/process_memory.h), bytes.
  std::vector<std::pair<std::string, int64_t>> memory_plan;
  int64_t memory_budget_bytes = 0;
  int64_t resident_bytes = 0;
  int64_t peak_resident_bytes = 0;
  std::vector<ExtraMetric> extra;  // samples of one name are grouped into one family
  std::vector<ExtraHistogram> extra_histograms;
};

// Appends the memory families of one engine process to `out`, each sample labelled with
// `labels` (e.g. worker and role): tandem_worker_memory_plan_bytes (by part),
// tandem_worker_memory_budget_bytes (where a budget was given), tandem_worker_resident_bytes
// and tandem_worker_peak_resident_bytes. Nothing when `engine` has no plan.
void AppendMemoryMetrics(const BackendStats& engine,
                         const std::vector<std::pair<std::string, std::string>>& labels,
                         std::vector<ExtraMetric>* out);

// The checks every backend makes at Submit: a non-empty prompt of token ids in [0, vocab_size),
// max_tokens >= 1, valid sampling (its token ids in the vocabulary too), and a prompt shorter
// than context_length tokens.
// InvalidArgument or OutOfRange naming the problem.
Status ValidateRequest(const GenerationRequest& request, int vocab_size, int context_length);

// Thread-safety: implementations are thread-safe: Submit, Stats, Drain and RetryAfterSeconds may
// be called concurrently from any thread (HTTP handlers, the status line, the shutdown path).
class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Queues the request. ResourceExhausted when the waiting queue is full, FailedPrecondition
  // when shutting down, InvalidArgument / OutOfRange when the request can never fit.
  // On error the sink is not called.
  virtual Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) = 0;
  virtual BackendStats Stats() const = 0;
  // Stops accepting; requests already queued run to completion until `deadline`, then are
  // finished with kCancelled. Returns when all sinks got OnFinish.
  virtual void Drain(Clock::time_point deadline) = 0;
  // After Submit refused a request with ResourceExhausted: seconds after which trying again
  // may succeed (the HTTP Retry-After header of the 429).
  virtual int RetryAfterSeconds() const { return 1; }
};

}  // namespace tandem::serving
