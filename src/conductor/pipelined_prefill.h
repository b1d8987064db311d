// A pipelined prefill carried out (protocol.h PipelineStage, policy/pipeline.h): one prefill
// call per stage worker, all at once, each with its range of layers and its successor's
// address; the last stage's answer is the prefill's. The first stage that fails cancels every
// stage (POST /v1/cancel with the pipeline's session), so none waits for chunks that will not
// come.
//
// Thread-safety: a free function; the clients are thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "common/status.h"
#include "conductor/cluster_view.h"
#include "conductor/policy/pipeline.h"
#include "conductor/worker_client.h"

namespace tandem::conductor {

struct StageWorker {
  cluster::WorkerInfo info;
  std::shared_ptr<WorkerClient> client;
};

struct PipelinedPrefill {
  cluster::PrefillResult result;   // the last stage's (its first token)
  LayerSplit split;                // how the layers were shared
  int chunk_tokens = 0;            // positions per chunk (PipelineChunkTokens)
  uint64_t stage_bytes = 0;        // residual stream passed between stages
  double first_stage_seconds = 0;  // stage 0's prefill time (the pipeline's fill starts there)
  double most_wait_seconds = 0;    // the longest any later stage waited for its input
};

// Whether a prefill with `uncached_tokens` tokens the decode side lacks is to be pipelined:
// long enough (options.min_tokens > 0), and no structured output, tool call or prompt logprobs
// (the last stage samples the first token with a plain sampler).
bool WantsPipeline(const PipelineOptions& options, const engine::SamplingParams& sampling,
                   int uncached_tokens);

// The stage workers of a pipeline: `first` (the prefill worker placement chose), then the
// healthy prefill workers of the same model (name, layer count, width) by predicted queue, up
// to max_stages in all. Empty when `first` is unknown, unhealthy or publishes no model width.
std::vector<StageWorker> ChoosePipelineGroup(const ClusterView& view, const std::string& first,
                                             int max_stages, Clock::time_point now);

// How a pipeline of `stages` workers whose first is `head` shares a prompt of `prompt_tokens`:
// the chunk size, and the layers split by head's cost model (by layer count without one).
struct PipelinePlan {
  int chunk_tokens = 0;
  LayerSplit split;
};
PipelinePlan PlanPipeline(const cluster::WorkerInfo& head, int64_t prompt_tokens, int stages,
                          const PipelineOptions& options);

// Runs `call` (prompt, sampling, KV target; its stage is set here) over `group` (at least two
// workers, group[0] computing the first layers) as `plan` (PlanPipeline for the group) says.
// `session` must be unique per attempt. The first stage's error (with the worker's name) when
// any fails.
StatusOr<PipelinedPrefill> RunPipelinedPrefill(const cluster::PrefillCall& call,
                                               std::span<const StageWorker> group,
                                               const PipelinePlan& plan, const std::string& session,
                                               Clock::time_point deadline);

}  // namespace tandem::conductor
