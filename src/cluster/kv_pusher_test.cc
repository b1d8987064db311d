// The KV hand-off through the real transfer engine (in one process, shared memory and TCP on
// loopback): a prefill engine pushes each layer into a decode engine's reserved blocks, the
// notification arrives after the data, and the decode side continues to the colocated output.
#include "cluster/kv_pusher.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "serving/local_backend.h"
#include "transfer/metadata.h"

namespace tandem::cluster {
namespace {

constexpr const char* kSmolLm2 = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kGemma = "gemma-3-270m-q4_k_m.gguf";  // sliding-window layers

std::string ModelPath(const std::string& file) {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(dir ? dir : ".") + "/models/" + file;
}

// An engine whose KV pool is a segment of `te` (as a worker has it).
std::unique_ptr<engine::Engine> LoadOn(transfer::TransferEngine* te, const std::string& segment,
                                       const std::string& file = kSmolLm2) {
  engine::EngineOptions o;
  o.model_path = ModelPath(file);
  o.max_sequences = 4;  // a window arena sized as a worker sizes it
  o.threads = 1;
  o.kv_capacity_tokens = 2048;
  if (te != nullptr) {
    o.kv_memory = [te, segment](size_t bytes) -> StatusOr<uint8_t*> {
      TANDEM_ASSIGN_OR_RETURN(void* p, te->AllocateSegment(segment, bytes));
      return static_cast<uint8_t*>(p);
    };
  }
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

class Collector : public serving::GenerationSink {
 public:
  // With a pusher: finishes the push at the first token, as the prefill worker does.
  explicit Collector(std::shared_ptr<KvPusher> pusher = nullptr, std::string note = {})
      : pusher_(std::move(pusher)), note_(std::move(note)) {}
  bool OnToken(const engine::SampledToken& sampled) override {
    const int32_t token = sampled.token;
    tokens_.push_back(token);
    if (pusher_ && tokens_.size() == 1) {
      nlohmann::json j = {{"id", note_}, {"first_token", token}};
      push_status_ = pusher_->Finish(j.dump());
    }
    return true;
  }
  void OnFinish(const serving::FinishInfo& info) override { done_.set_value(info); }
  serving::FinishInfo Wait() { return done_.get_future().get(); }
  std::vector<int32_t> tokens_;
  Status push_status_ = Internal("not pushed");

 private:
  std::shared_ptr<KvPusher> pusher_;
  std::string note_;
  std::promise<serving::FinishInfo> done_;
};

// A prefill and a decode engine on their own transfer engines (as two workers have them), and a
// plain reference engine for the colocated output. Parameters: the protocol and the model.
class KvPusherTest : public ::testing::TestWithParam<std::tuple<transfer::Protocol, const char*>> {
 protected:
  static transfer::Protocol protocol() { return std::get<0>(GetParam()); }
  static bool gemma() { return std::string(std::get<1>(GetParam())) == kGemma; }

  void SetUp() override {
    auto meta = transfer::OpenMetadataStore(
        "embedded:kv-pusher-test-" + std::string(transfer::ProtocolName(protocol())) + "-" +
        std::get<1>(GetParam()) + "-" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(meta.ok());
    auto make_te = [&](const std::string& name) {
      transfer::TransferEngineOptions o;
      o.local_name = name;
      o.metadata = *meta;
      o.protocols = {protocol()};
      auto te = transfer::TransferEngine::Create(o);
      EXPECT_TRUE(te.ok()) << te.status().ToString();
      return te.ok() ? std::move(*te) : nullptr;
    };
    prefill_te = make_te("prefill");
    decode_te = make_te("decode");
    ASSERT_TRUE(prefill_te && decode_te);
    decode_te->SetNotificationHandler([&](const transfer::Notification& n) {
      std::lock_guard<std::mutex> lock(mu);
      notes.push_back(n.message);
      cv.notify_all();
    });
    const char* file = std::get<1>(GetParam());
    prefill_engine = LoadOn(prefill_te.get(), "prefill/kv", file);
    decode_engine = LoadOn(decode_te.get(), "decode/kv", file);
    reference_engine = LoadOn(nullptr, "", file);
    ASSERT_TRUE(prefill_engine && decode_engine && reference_engine);
    prefill = serving::MakeLocalBackend(prefill_engine.get(), {.max_batch_tokens = 40});
    decode = serving::MakeLocalBackend(decode_engine.get(), {});
    reference = serving::MakeLocalBackend(reference_engine.get(), {});
    auto opened = prefill_te->OpenSegment("decode/kv");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    segment = *opened;
    EXPECT_EQ(*prefill_te->SegmentProtocol(segment), protocol());
  }

  void TearDown() override {
    reference.reset();
    decode.reset();
    prefill.reset();
  }

  serving::GenerationRequest Request(const std::string& id, const std::string& text) {
    serving::GenerationRequest req;
    req.id = id;
    req.prompt_tokens = prefill_engine->tokenizer().Encode(text, false, false);
    req.max_tokens = 12;
    req.ignore_eos = true;
    return req;
  }

  // Prefill pushes `req`'s KV into `blocks` (the first skip_blocks not written), the decode
  // side continues; returns the tokens, checked against the reference engine's. *bytes: KV sent.
  std::vector<int32_t> HandOff(const serving::GenerationRequest& req,
                               serving::LocalBackend::Reserved reserved, int skip_blocks,
                               uint64_t* bytes) {
    const int n_prompt = static_cast<int>(req.prompt_tokens.size());
    KvTarget target{"decode/kv",
                    std::move(reserved.blocks),
                    16,
                    decode_engine->config().n_layers,
                    decode_engine->kv().LayerSliceBytes(),
                    "decode",
                    skip_blocks,
                    std::move(reserved.window_blocks),
                    decode_engine->kv().WindowArenaOffset(),
                    decode_engine->kv().shape().window_tokens};
    EXPECT_TRUE(KvPusher::CheckTarget(prefill_engine->kv(), target, n_prompt).ok());
    auto pusher =
        std::make_shared<KvPusher>(prefill_te.get(), &prefill_engine->kv(), segment, target,
                                   n_prompt, Clock::now() + std::chrono::seconds(30));
    auto first = req;
    first.max_tokens = 1;
    auto prefill_sink = std::make_shared<Collector>(pusher, req.id);
    EXPECT_TRUE(prefill->SubmitObserved(first, prefill_sink, pusher).ok());
    prefill_sink->Wait();
    EXPECT_TRUE(prefill_sink->push_status_.ok()) << prefill_sink->push_status_.ToString();
    *bytes = pusher->bytes_sent();
    {
      std::unique_lock<std::mutex> lock(mu);
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !notes.empty(); }));
      if (!notes.empty()) {
        const auto j = nlohmann::json::parse(notes.back());
        EXPECT_EQ(j.at("id"), req.id);
        EXPECT_EQ(j.at("first_token"), prefill_sink->tokens_.at(0));
      }
      notes.clear();
    }
    auto decode_sink = std::make_shared<Collector>();
    EXPECT_TRUE(decode->SubmitPrefilled(req, prefill_sink->tokens_.at(0), decode_sink).ok());
    decode_sink->Wait();
    std::vector<int32_t> got = {prefill_sink->tokens_.at(0)};
    got.insert(got.end(), decode_sink->tokens_.begin(), decode_sink->tokens_.end());
    auto ref_sink = std::make_shared<Collector>();
    EXPECT_TRUE(reference->Submit(req, ref_sink).ok());
    ref_sink->Wait();
    EXPECT_EQ(got, ref_sink->tokens_);
    return got;
  }

  std::unique_ptr<transfer::TransferEngine> prefill_te, decode_te;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> notes;  // guarded by mu
  std::unique_ptr<engine::Engine> prefill_engine, decode_engine, reference_engine;
  std::unique_ptr<serving::LocalBackend> prefill, decode, reference;
  transfer::SegmentHandle segment{};
};

std::string LongText() {
  std::string text;
  for (int i = 0; i < 10; ++i) text += "Line " + std::to_string(i) + " of a longer prompt. ";
  return text;
}

TEST_P(KvPusherTest, PushedKvContinuesToTheColocatedOutput) {
  // For Gemma, a prompt past its 512-token window: the sliding layers send only their last
  // window, from blocks the prefill side has not yet given back.
  std::string text = LongText();
  if (gemma()) {
    for (int i = 10; i < 90; ++i) text += "Line " + std::to_string(i) + " of a longer prompt. ";
  }
  const auto req = Request("req-1", text);
  const int n_prompt = static_cast<int>(req.prompt_tokens.size());
  ASSERT_GT(n_prompt, gemma() ? 700 : 80);  // several 40-token prefill chunks, several blocks
  auto reserved =
      decode->ReserveBlocks(req.id, n_prompt + 1, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(reserved.ok());
  uint64_t bytes = 0;
  HandOff(req, *reserved, 0, &bytes);
  // Every global layer of every prompt block went over, every sliding layer of the blocks in
  // the window behind position n_prompt; some blocks twice (chunk boundaries).
  const auto& kv = decode_engine->kv();
  const int blocks = kv.BlocksFor(n_prompt);
  const uint64_t slices =
      static_cast<uint64_t>(blocks) * kv.shape().NumGlobalLayers() +
      static_cast<uint64_t>(blocks - kv.WindowStartBlock(n_prompt)) * kv.shape().NumSlidingLayers();
  const uint64_t resent = static_cast<uint64_t>(n_prompt / 40 + 1) * kv.shape().n_layers;
  EXPECT_GE(bytes, slices * kv.LayerSliceBytes());
  EXPECT_LE(bytes, (slices + resent) * kv.LayerSliceBytes());
}

TEST_P(KvPusherTest, OnlyTheBlocksTheDecodeSideLacksAreSent) {
  // The first request leaves its prompt blocks in the decode side's prefix cache.
  const auto a = Request("req-a", LongText());
  const int n_a = static_cast<int>(a.prompt_tokens.size());
  auto first = decode->ReserveBlocks(a.id, n_a + 1, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(first.ok());
  uint64_t full_bytes = 0;
  HandOff(a, *first, 0, &full_bytes);
  // The second shares that prefix: the decode side reserves only what it lacks.
  const auto b = Request("req-b", LongText() + "And a different ending for the second request.");
  const int n_b = static_cast<int>(b.prompt_tokens.size());
  auto reserved = decode->ReservePrompt(b.id, b.prompt_tokens, n_b + 1,
                                        Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  const int shared_blocks = n_a / 16;  // full blocks of a's prompt, all shared with b's
  EXPECT_GE(reserved->cached_blocks, shared_blocks - 1);
  ASSERT_GT(reserved->cached_blocks, 0);
  // A prefill worker that does not hold the prefix computes it in 40-token chunks, the first
  // ones inside the skipped blocks: they send nothing.
  prefill.reset();
  prefill = serving::MakeLocalBackend(prefill_engine.get(),
                                      {.max_batch_tokens = 40, .enable_prefix_cache = false});
  uint64_t bytes = 0;
  HandOff(b, *reserved, reserved->cached_blocks, &bytes);
  // Nothing below the skipped blocks went over: at most the rest of b's blocks (some twice,
  // at most once per 40-token chunk boundary).
  const uint64_t slice = decode_engine->kv().LayerSliceBytes() * decode_engine->config().n_layers;
  const int rest = (n_b + 15) / 16 - reserved->cached_blocks;
  EXPECT_LE(bytes, static_cast<uint64_t>(rest + n_b / 40 + 1) * slice);
  EXPECT_LT(bytes, full_bytes);
}

INSTANTIATE_TEST_SUITE_P(ProtocolsAndModels, KvPusherTest,
                         ::testing::Combine(::testing::Values(transfer::Protocol::kShm,
                                                              transfer::Protocol::kTcp),
                                            ::testing::Values(kSmolLm2, kGemma)),
                         [](const auto& info) {
                           return std::string(transfer::ProtocolName(std::get<0>(info.param))) +
                                  (std::string(std::get<1>(info.param)) == kGemma ? "_Gemma3"
                                                                                  : "_SmolLM2");
                         });

TEST(KvPusherCheckTest, MismatchedGeometryAndShortReservationsAreRefused) {
  auto e = LoadOn(nullptr, "");
  ASSERT_NE(e, nullptr);
  const auto& kv = e->kv();
  KvTarget ok{"seg", {1, 2, 3}, 16, kv.shape().n_layers, kv.LayerSliceBytes(), "d"};
  EXPECT_TRUE(KvPusher::CheckTarget(kv, ok, 40).ok());
  EXPECT_EQ(KvPusher::CheckTarget(kv, ok, 49).code(), StatusCode::kInvalidArgument);  // 4 blocks
  KvTarget layers = ok;
  layers.n_layers += 1;
  EXPECT_EQ(KvPusher::CheckTarget(kv, layers, 40).code(), StatusCode::kFailedPrecondition);
  KvTarget block = ok;
  block.block_tokens = 32;
  EXPECT_EQ(KvPusher::CheckTarget(kv, block, 40).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::cluster
