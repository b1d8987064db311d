#include "conductor/pipelined_prefill.h"

#include <algorithm>
#include <future>
#include <optional>

namespace tandem::conductor {

bool WantsPipeline(const PipelineOptions& options, const engine::SamplingParams& sampling,
                   int uncached_tokens) {
  return options.min_tokens > 0 && options.max_stages >= 2 &&
         uncached_tokens >= options.min_tokens && sampling.json_schema.empty() &&
         sampling.prompt_logprobs < 0 &&
         sampling.tool_mode == engine::SamplingParams::ToolMode::kNone;
}

std::vector<StageWorker> ChoosePipelineGroup(const ClusterView& view, const std::string& first,
                                             int max_stages, Clock::time_point now) {
  const auto it = view.workers().find(first);
  if (it == view.workers().end()) return {};
  const ClusterView::Worker& head = it->second;
  if (!head.healthy || !head.client || head.info.model_dim <= 0) return {};
  std::vector<std::pair<double, const ClusterView::Worker*>> others;
  for (const auto& [name, w] : view.workers()) {
    if (name == first || !w.healthy || !w.client || w.info.role != cluster::Role::kPrefill ||
        w.info.model != head.info.model || w.info.n_layers != head.info.n_layers ||
        w.info.model_dim != head.info.model_dim) {
      continue;
    }
    others.emplace_back(ClusterView::QueueSeconds(w, now), &w);
  }
  std::stable_sort(others.begin(), others.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<StageWorker> group = {{head.info, head.client}};
  for (const auto& [queue, w] : others) {
    if (static_cast<int>(group.size()) >= max_stages) break;
    group.push_back({w->info, w->client});
  }
  return group;
}

PipelinePlan PlanPipeline(const cluster::WorkerInfo& head, int64_t prompt_tokens, int stages,
                          const PipelineOptions& options) {
  CostModel cost = head.cost;
  if (!cost.valid()) {  // no profile: every layer alike
    cost = CostModel{};
    cost.prefill_per_token_s = 1;
  }
  PipelinePlan plan;
  plan.chunk_tokens = PipelineChunkTokens(prompt_tokens, options.chunk_tokens);
  plan.split = SplitLayers(cost, head.n_layers, head.layer_windows, prompt_tokens, stages,
                           plan.chunk_tokens);
  return plan;
}

StatusOr<PipelinedPrefill> RunPipelinedPrefill(const cluster::PrefillCall& call,
                                               std::span<const StageWorker> group,
                                               const PipelinePlan& plan, const std::string& session,
                                               Clock::time_point deadline) {
  const int stages = static_cast<int>(group.size());
  if (stages < 2) return InvalidArgument("a pipeline needs at least two prefill workers");
  if (static_cast<int>(plan.split.bounds.size()) != stages + 1) {
    return InvalidArgument("the pipeline's plan is for " +
                           std::to_string(plan.split.bounds.size() - 1) + " stages, not " +
                           std::to_string(stages));
  }
  PipelinedPrefill out;
  out.chunk_tokens = plan.chunk_tokens;
  out.split = plan.split;
  std::vector<std::future<StatusOr<cluster::PrefillResult>>> pending;
  for (int i = 0; i < stages; ++i) {
    cluster::PrefillCall c = call;
    c.stage.session = session;
    c.stage.index = i;
    c.stage.stages = stages;
    c.stage.begin_layer = out.split.bounds[i];
    c.stage.end_layer = out.split.bounds[i + 1];
    c.stage.chunk_tokens = out.chunk_tokens;
    if (i + 1 < stages) {
      c.stage.next_worker = group[i + 1].info.name;
      c.stage.next_host = group[i + 1].info.host;
      c.stage.next_port = group[i + 1].info.port;
    }
    pending.push_back(std::async(std::launch::async, [client = group[i].client, c, deadline] {
      return client->Prefill(c, deadline);
    }));
  }
  // Every answer is awaited (the calls hold references to nothing here but their own copies);
  // the first failure cancels the rest at once.
  std::vector<std::optional<StatusOr<cluster::PrefillResult>>> got(stages);
  Status failed;
  for (int remaining = stages; remaining > 0;) {
    for (int i = 0; i < stages; ++i) {
      if (got[i] ||
          pending[i].wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
        continue;
      }
      got[i] = pending[i].get();
      --remaining;
      if (got[i]->ok() || !failed.ok()) continue;
      failed = got[i]->status().WithContext("pipeline stage " + std::to_string(i) + " on " +
                                            group[i].info.name);
      for (const StageWorker& w : group) {
        w.client->Cancel(session, Clock::now() + std::chrono::seconds(1));
      }
    }
  }
  if (!failed.ok()) return failed;
  out.result = **got.back();
  for (int i = 0; i < stages; ++i) {
    const cluster::PrefillResult& r = **got[i];
    out.stage_bytes += r.stage_bytes_sent;
    if (i == 0) out.first_stage_seconds = r.prefill_seconds;
    if (i > 0) out.most_wait_seconds = std::max(out.most_wait_seconds, r.stage_wait_seconds);
    if (i + 1 < stages) out.result.kv_bytes += r.kv_bytes;
  }
  return out;
}

}  // namespace tandem::conductor
