// The mock forward pass (engine/mock_forward.h) behind a real Transformer: inputs checked as
// before, the profile's time spent layer by layer, logits that draw the mock's token, no KV
// written.
#include "engine/mock_forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/test_model.h"
#include "engine/transformer.h"

namespace tandem::engine {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct MockFixture {
  MockFixture() : pool(1) {
    spec.n_layers = 4;
    path = testing::WriteTinyLlama(spec);
    file = std::move(model::GgufFile::Open(path).value());
    config = model::ReadModelConfig(*file).value();
    weights = BindWeights(*file, config).value();
    tf = std::make_unique<Transformer>(config, weights, &pool);
    EngineOptions layout;
    layout.block_tokens = 8;
    kv = std::move(PagedKvCache::Create(KvShapeFor(config, layout, 8 * 16)).value());
  }
  ~MockFixture() { std::remove(path.c_str()); }

  testing::TinyLlamaSpec spec;
  ThreadPool pool;
  std::string path;
  std::unique_ptr<model::GgufFile> file;
  model::ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<PagedKvCache> kv;
};

TEST(MockForwardTest, SleepsTheProfilesTimeLayerByLayerAndDrawsItsToken) {
  MockFixture f;
  constexpr int32_t kToken = 17;
  std::vector<size_t> seen_batch_sizes;
  f.tf->SetMock(MockForward({.step_seconds =
                                 [&](std::span<const BatchItem> batch) {
                                   seen_batch_sizes.push_back(batch.size());
                                   return 0.04;
                                 },
                             .token = kToken}));
  ASSERT_TRUE(f.tf->mocked());
  const std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {2};
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  const std::vector<int32_t> next = {3};
  // Item a wants every row (prompt logprobs): 10 rows; item b its last: 1 row.
  const BatchItem items[] = {{blocks_a, 0, prompt, true, true}, {blocks_b, 4, next, true}};
  std::vector<int> layers;
  std::vector<double> layer_at;
  const auto start = Clock::now();
  f.tf->SetLayerDoneCallback([&](int l) {
    layers.push_back(l);
    layer_at.push_back(SecondsSince(start));
  });
  // The cache's bytes before: a mock writes no KV.
  const auto* base = f.kv->Keys(0, 0, 0);
  const size_t bytes = PagedKvCache::RequiredBytes(f.kv->shape());
  const std::vector<uint8_t> before(reinterpret_cast<const uint8_t*>(base),
                                    reinterpret_cast<const uint8_t*>(base) + bytes);
  std::vector<float> logits;
  ASSERT_TRUE(f.tf->Forward(items, *f.kv, &logits).ok());
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.04);
  EXPECT_EQ(seen_batch_sizes, std::vector<size_t>{2});
  EXPECT_EQ(layers, (std::vector<int>{0, 1, 2, 3}));
  // Spread over the layers: the first layer is done a quarter of the way in, not at the end.
  ASSERT_EQ(layer_at.size(), 4u);
  EXPECT_GE(layer_at[0], 0.01);
  EXPECT_GE(layer_at[3], 0.04);
  EXPECT_LT(layer_at[0], layer_at[3]);
  EXPECT_EQ(std::memcmp(before.data(), base, bytes), 0);

  const int vocab = f.config.vocab_size;
  ASSERT_EQ(logits.size(), static_cast<size_t>(11 * vocab));
  for (int r = 0; r < 11; ++r) {
    const auto row = std::span(logits).subspan(static_cast<size_t>(r) * vocab, vocab);
    EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), kToken) << "row " << r;
  }
  // A sampler at temperature 1 draws it too.
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 7;
  Sampler sampler(params, prompt, {});
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(sampler.Sample(std::span(logits).subspan(0, vocab)).token, kToken);
}

TEST(MockForwardTest, HostWorkCreditedShortensTheNextStepOnly) {
  MockFixture f;
  f.tf->SetMock(MockForward({.step_seconds = [](auto) { return 10.0; }, .token = 1}));
  const std::vector<int32_t> blocks = {0};
  const std::vector<int32_t> tokens = {4};
  const BatchItem item{blocks, 0, tokens, true};
  std::vector<float> logits;
  // 10 s of step, 9.98 s of it done by the host already: the pass sleeps ~20 ms, far below
  // the 10 s it would (the bound leaves a loaded machine 5 s of slack).
  f.tf->CreditMockHostSeconds(9.98);
  auto start = Clock::now();
  ASSERT_TRUE(f.tf->Forward({&item, 1}, *f.kv, &logits).ok());
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_GE(SecondsSince(start), 0.02);
  // The credit is spent: a second pass with a 20 ms credit out of 30 ms sleeps at least 10.
  f.tf->SetMock(MockForward({.step_seconds = [](auto) { return 0.03; }, .token = 1}));
  f.tf->CreditMockHostSeconds(0.02);
  start = Clock::now();
  ASSERT_TRUE(f.tf->Forward({&item, 1}, *f.kv, &logits).ok());
  EXPECT_GE(SecondsSince(start), 0.01);
  start = Clock::now();
  ASSERT_TRUE(f.tf->Forward({&item, 1}, *f.kv, &logits).ok());
  EXPECT_GE(SecondsSince(start), 0.03);
}

TEST(MockForwardTest, BadInputIsStillRefusedAndStagesTakeTheirShare) {
  MockFixture f;
  f.tf->SetMock(MockForward({.step_seconds = [](auto) { return 0.04; }, .token = 1}));
  const std::vector<int32_t> blocks = {0};
  const std::vector<int32_t> bad = {f.config.vocab_size};
  std::vector<float> logits;
  const BatchItem bad_item{blocks, 0, bad, true};
  EXPECT_EQ(f.tf->Forward({&bad_item, 1}, *f.kv, &logits).code(), StatusCode::kInvalidArgument);

  // A stage of layers 0..1 of 4: half the step, zeros of (T, dim) handed on.
  const std::vector<int32_t> tokens = {4, 5, 6};
  const BatchItem item{blocks, 0, tokens, true};
  std::vector<float> hidden = {1.0f};
  const auto start = Clock::now();
  ASSERT_TRUE(f.tf->ForwardLayers({&item, 1}, *f.kv, 0, 2, {}, &hidden, &logits).ok());
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.02);
  ASSERT_EQ(hidden.size(), static_cast<size_t>(3 * f.config.dim));
  EXPECT_TRUE(std::all_of(hidden.begin(), hidden.end(), [](float v) { return v == 0; }));
}

}  // namespace
}  // namespace tandem::engine
