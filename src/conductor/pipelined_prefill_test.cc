#include "conductor/pipelined_prefill.h"

#include <gtest/gtest.h>

namespace tandem::conductor {
namespace {

// A healthy prefill worker of `model` with a client (never called here).
void AddWorker(ClusterView& view, const std::string& name, cluster::Role role,
               const std::string& model = "gemma.gguf", int dim = 640) {
  ClusterView::Worker& w = view.workers()[name];
  w.info.name = name;
  w.info.role = role;
  w.info.model = model;
  w.info.n_layers = 18;
  w.info.model_dim = dim;
  w.healthy = true;
  w.client = std::make_shared<WorkerClient>("127.0.0.1", 1);
}

TEST(PipelineGroupTest, LongPlainPromptsOnly) {
  const PipelineOptions on{.min_tokens = 4096, .max_stages = 2, .chunk_tokens = 1024};
  engine::SamplingParams plain;
  EXPECT_TRUE(WantsPipeline(on, plain, 4096));
  EXPECT_FALSE(WantsPipeline(on, plain, 4095));
  EXPECT_FALSE(WantsPipeline({.min_tokens = 0, .max_stages = 2, .chunk_tokens = 1024}, plain,
                             1 << 20));  // off
  engine::SamplingParams schema;
  schema.json_schema = R"({"type": "object"})";
  EXPECT_FALSE(WantsPipeline(on, schema, 8192));
  engine::SamplingParams prompt_logprobs;
  prompt_logprobs.prompt_logprobs = 1;
  EXPECT_FALSE(WantsPipeline(on, prompt_logprobs, 8192));
}

TEST(PipelineGroupTest, PlacedWorkerFirstThenIdlestOfTheSameModel) {
  ClusterView view;
  AddWorker(view, "p0", cluster::Role::kPrefill);
  AddWorker(view, "p1", cluster::Role::kPrefill);
  AddWorker(view, "p2", cluster::Role::kPrefill);
  AddWorker(view, "d0", cluster::Role::kDecode);
  AddWorker(view, "other-model", cluster::Role::kPrefill, "smollm2.gguf", 576);
  AddWorker(view, "sick", cluster::Role::kPrefill);
  view.workers()["sick"].healthy = false;
  // p1 has a prefill queued: p2 comes first.
  RequestLoad load;
  load.seq = 7;
  Placement placed;
  placed.predicted_prefill_s = 5.0;
  const Clock::time_point now = Clock::now();
  view.Commit(load, placed, "d0", "p1", 1, now);
  ASSERT_TRUE(view.Dispatch(7, "d0", "p1", 0, now));

  auto names = [](const std::vector<StageWorker>& g) {
    std::vector<std::string> out;
    for (const auto& w : g) out.push_back(w.info.name);
    return out;
  };
  EXPECT_EQ(names(ChoosePipelineGroup(view, "p0", 2, now)), (std::vector<std::string>{"p0", "p2"}));
  EXPECT_EQ(names(ChoosePipelineGroup(view, "p0", 8, now)),
            (std::vector<std::string>{"p0", "p2", "p1"}));
  // Nothing to pipeline with: an unknown or unhealthy first worker, or no other of its model.
  EXPECT_TRUE(ChoosePipelineGroup(view, "nobody", 2, now).empty());
  EXPECT_TRUE(ChoosePipelineGroup(view, "sick", 2, now).empty());
  EXPECT_EQ(ChoosePipelineGroup(view, "other-model", 2, now).size(), 1u);
}

}  // namespace
}  // namespace tandem::conductor
