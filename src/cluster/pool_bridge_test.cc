// Two serving loops (two engines, as two workers have them) share a prefix through the KV pool:
// a real master over HTTP, real transfer engines, real model. What one computed, the other
// reads instead of recomputing, and its output is the same token for token.
#include "cluster/pool_bridge.h"

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <thread>

#include "engine/engine.h"
#include "serving/local_backend.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace tandem::cluster {
namespace {

std::string ModelPath(const std::string& file = "SmolLM2-135M-Instruct.Q4_1.gguf") {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(dir ? dir : ".") + "/models/" + file;
}

bool WaitFor(const std::function<bool()>& pred) {
  for (int i = 0; i < 500 && !pred(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

class Collector : public serving::GenerationSink {
 public:
  bool OnToken(const engine::SampledToken& sampled) override {
    const int32_t token = sampled.token;
    tokens.push_back(token);
    return true;
  }
  void OnFinish(const serving::FinishInfo& info) override { done.set_value(info); }
  std::vector<int32_t> tokens;
  std::promise<serving::FinishInfo> done;
};

// One worker's parts: transfer engine, engine on a KV segment of it, pool client with a DRAM
// segment, and the serving loop with the bridge.
struct Member {
  Member(const std::string& name, std::shared_ptr<transfer::MetadataStore> meta, bool pool,
         const std::string& model = "SmolLM2-135M-Instruct.Q4_1.gguf") {
    transfer::TransferEngineOptions to;
    to.local_name = name;
    to.metadata = meta;
    te = std::move(*transfer::TransferEngine::Create(to));
    engine::EngineOptions eo;
    eo.model_path = ModelPath(model);
    eo.threads = 1;
    eo.kv_capacity_tokens = 1024;
    eo.kv_memory = [this, name](size_t bytes) -> StatusOr<uint8_t*> {
      TANDEM_ASSIGN_OR_RETURN(void* p, te->AllocateSegment(name + "/kv", bytes));
      return static_cast<uint8_t*>(p);
    };
    auto e = engine::Engine::Load(eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine = std::move(*e);
    serving::SchedulerOptions so;
    if (pool) {
      store::PoolClientOptions po;
      po.metadata = meta;
      po.engine = te.get();
      po.node = name;
      client = std::move(*store::PoolClient::Create(po));
      EXPECT_TRUE(client->MountDram(name + "/pool", 32 << 20).ok());
      so.kv_pool = std::make_shared<PoolBridge>(client.get(), &engine->kv(), model,
                                                std::chrono::seconds(2), std::chrono::seconds(2));
    }
    backend = serving::MakeLocalBackend(engine.get(), so);
  }
  ~Member() { backend.reset(); }  // the loop stops before the client and engine go

  // Greedy generation of 8 tokens; returns the tokens and the finish info.
  std::pair<std::vector<int32_t>, serving::FinishInfo> Run(const std::vector<int32_t>& prompt,
                                                           const std::string& id) {
    serving::GenerationRequest r;
    r.id = id;
    r.prompt_tokens = prompt;
    r.max_tokens = 8;
    r.ignore_eos = true;
    auto sink = std::make_shared<Collector>();
    auto done = sink->done.get_future();
    EXPECT_TRUE(backend->Submit(r, sink).ok());
    auto info = done.get();
    return {sink->tokens, info};
  }

  std::unique_ptr<transfer::TransferEngine> te;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<store::PoolClient> client;
  std::unique_ptr<serving::LocalBackend> backend;
};

TEST(PoolBridgeTest, APrefixComputedByOneWorkerIsReadByAnother) {
  auto meta = *transfer::OpenMetadataStore("embedded:pool-bridge-test");
  auto master = store::PoolMasterServer::Start("127.0.0.1", 0, {}, meta);
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  Member a("worker-a", meta, true), b("worker-b", meta, true), alone("alone", meta, false);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(1000 + (i * 37) % 5000);  // 9 full blocks

  const auto [ref_tokens, ref_info] = alone.Run(prompt, "ref");
  const auto [a_tokens, a_info] = a.Run(prompt, "a");
  EXPECT_EQ(a_tokens, ref_tokens);
  EXPECT_EQ(a_info.cached_prompt_tokens, 0);
  // A offers its finished sequence (prompt and answer: 157 positions computed = 9 full blocks)
  // once its sink has heard the finish.
  ASSERT_TRUE(WaitFor([&] { return a.client->Stats().put_objects >= 9; }))
      << "puts " << a.client->Stats().put_objects << " failures " << a.client->Stats().put_failures
      << " no space " << a.client->Stats().put_no_space << " master unavailable "
      << a.client->Stats().master_unavailable;
  EXPECT_EQ(a.client->Stats().put_objects, 9u);

  const auto [b_tokens, b_info] = b.Run(prompt, "b");
  EXPECT_EQ(b_tokens, ref_tokens);
  // B had nothing locally; the pool gave it every full block but the last one before the
  // position it must compute (at least one prompt token is computed for the logits).
  EXPECT_EQ(b_info.cached_prompt_tokens, 144);
  EXPECT_EQ(b.backend->Stats().pool_hit_tokens, 144);
  EXPECT_EQ(b.client->Stats().hit_objects, 9u);
  EXPECT_EQ(b.client->Stats().fetch_failures, 0u);
  // B's sequence ends in the same 9 blocks, which the pool holds already: nothing is offered.
  EXPECT_EQ(b.client->Stats().put_objects, 0u);

  // A second request on B hits its local cache first (no pool read for those blocks).
  const uint64_t reads_before = b.client->Stats().hit_objects;
  const auto [b2_tokens, b2_info] = b.Run(prompt, "b2");
  EXPECT_EQ(b2_tokens, ref_tokens);
  EXPECT_EQ(b2_info.cached_prompt_tokens, 144);
  EXPECT_EQ(b.client->Stats().hit_objects, reads_before);
}

// A decode worker's reservation for pushed KV reads what the pool holds beyond its own cache,
// so the prefill side pushes only the rest (skip_blocks = cached_blocks); the blocks read join
// its prefix cache, and a sequence on them continues as the reference does.
TEST(PoolBridgeTest, ADecodeReservationTakesThePoolsBlocks) {
  auto meta = *transfer::OpenMetadataStore("embedded:pool-bridge-reserve-test");
  auto master = store::PoolMasterServer::Start("127.0.0.1", 0, {}, meta);
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  Member a("worker-a", meta, true), d("decode-d", meta, true), alone("alone", meta, false);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(2000 + (i * 53) % 4000);  // 9 full blocks
  const auto [ref_tokens, ref_info] = alone.Run(prompt, "ref");
  ASSERT_EQ(a.Run(prompt, "a").first, ref_tokens);
  ASSERT_TRUE(WaitFor([&] { return a.client->Stats().put_objects >= 9; }));

  auto reserved = d.backend->ReservePrompt("push-1", prompt, static_cast<int>(prompt.size()) + 1,
                                           serving::Clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(reserved->cached_blocks, 9);  // every full block but the last token's
  EXPECT_EQ(d.backend->Stats().pool_hit_tokens, 144);
  d.backend->CancelReservation("push-1");
  // The blocks read are in d's prefix cache now: a request on d computes only the tail, and
  // its output equals the reference (the KV read is the KV computed).
  const auto [d_tokens, d_info] = d.Run(prompt, "d");
  EXPECT_EQ(d_tokens, ref_tokens);
  EXPECT_EQ(d_info.cached_prompt_tokens, 144);
  EXPECT_EQ(d.client->Stats().hit_objects, 9u);  // read once, by the reservation
}

// Gemma 3 (sliding-window layers): the pool carries a prefix's global blocks and the windows
// behind its end, read by another worker and by a decode reservation, and the outputs are the
// ones computed alone.
TEST(PoolBridgeTest, ASlidingWindowPrefixTravelsWithItsWindows) {
  const std::string gemma = "gemma-3-270m-q4_k_m.gguf";
  auto meta = *transfer::OpenMetadataStore("embedded:pool-bridge-gemma-test");
  auto master = store::PoolMasterServer::Start("127.0.0.1", 0, {}, meta);
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  Member a("worker-a", meta, true, gemma), b("worker-b", meta, true, gemma),
      d("decode-d", meta, true, gemma), alone("alone", meta, false, gemma);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 700; ++i) prompt.push_back(1000 + (i * 37) % 5000);  // 43 full blocks + 12

  const auto [ref_tokens, ref_info] = alone.Run(prompt, "ref");
  ASSERT_EQ(a.Run(prompt, "a").first, ref_tokens);
  // A's sequence ends at 707 positions (44 full blocks): it offers the 44 blocks, and the 33
  // windows of blocks 11..43: behind the prompt's end (block 43: blocks 11..42, pinned by its
  // prefix cache) and behind its own end (block 44: blocks 12..43).
  ASSERT_TRUE(WaitFor([&] { return a.client->Stats().put_objects >= 44 + 33; }))
      << "puts " << a.client->Stats().put_objects;
  EXPECT_EQ(a.client->Stats().put_objects, 44u + 33u);

  const auto [b_tokens, b_info] = b.Run(prompt, "b");
  EXPECT_EQ(b_tokens, ref_tokens);
  EXPECT_EQ(b_info.cached_prompt_tokens, 43 * 16);      // all but the last token's block
  EXPECT_EQ(b.client->Stats().hit_objects, 43u + 32u);  // the blocks, and windows 11..42
  EXPECT_EQ(b.backend->Stats().pool_window_misses, 0);

  auto reserved = d.backend->ReservePrompt("push-1", prompt, static_cast<int>(prompt.size()) + 1,
                                           serving::Clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(reserved->cached_blocks, 43);
  d.backend->CancelReservation("push-1");
  const auto [d_tokens, d_info] = d.Run(prompt, "d");
  EXPECT_EQ(d_tokens, ref_tokens);
  EXPECT_EQ(d_info.cached_prompt_tokens, 43 * 16);
}

// Without a master the loop computes everything and says so in the pool counters.
TEST(PoolBridgeTest, NoMasterMeansLocalOnly) {
  auto meta = *transfer::OpenMetadataStore("embedded:pool-bridge-test-no-master");
  Member a("worker-a", meta, true), alone("alone", meta, false);
  std::vector<int32_t> prompt(100, 0);
  for (int i = 0; i < 100; ++i) prompt[i] = 2000 + i;
  const auto [ref_tokens, ref_info] = alone.Run(prompt, "ref");
  const auto [tokens, info] = a.Run(prompt, "a");
  EXPECT_EQ(tokens, ref_tokens);
  EXPECT_EQ(info.cached_prompt_tokens, 0);
  EXPECT_GE(a.client->Stats().master_unavailable, 1u);
}

}  // namespace
}  // namespace tandem::cluster
