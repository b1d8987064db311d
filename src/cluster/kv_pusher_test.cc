// The KV hand-off through the real transfer engine (in one process, shared memory and TCP on
// loopback): a prefill engine pushes each layer into a decode engine's reserved blocks, the
// notification arrives after the data, and the decode side continues to the colocated output.
#include "cluster/kv_pusher.h"

#include <condition_variable>
#include <future>
#include <mutex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "serving/local_backend.h"
#include "transfer/metadata.h"

namespace tandem::cluster {
namespace {

std::string ModelPath() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(dir ? dir : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// An engine whose KV pool is a segment of `te` (as a worker has it).
std::unique_ptr<engine::Engine> LoadOn(transfer::TransferEngine* te, const std::string& segment) {
  engine::EngineOptions o;
  o.model_path = ModelPath();
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
  bool OnToken(int32_t token) override {
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

class KvPusherTest : public ::testing::TestWithParam<transfer::Protocol> {};

TEST_P(KvPusherTest, PushedKvContinuesToTheColocatedOutput) {
  auto meta = transfer::OpenMetadataStore("embedded:kv-pusher-test-" +
                                          std::string(transfer::ProtocolName(GetParam())));
  ASSERT_TRUE(meta.ok());
  auto make_te = [&](const std::string& name) {
    transfer::TransferEngineOptions o;
    o.local_name = name;
    o.metadata = *meta;
    o.protocols = {GetParam()};
    auto te = transfer::TransferEngine::Create(o);
    EXPECT_TRUE(te.ok()) << te.status().ToString();
    return te.ok() ? std::move(*te) : nullptr;
  };
  auto prefill_te = make_te("prefill");
  auto decode_te = make_te("decode");
  ASSERT_TRUE(prefill_te && decode_te);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> notes;
  decode_te->SetNotificationHandler([&](const transfer::Notification& n) {
    std::lock_guard<std::mutex> lock(mu);
    notes.push_back(n.message);
    cv.notify_all();
  });
  auto prefill_engine = LoadOn(prefill_te.get(), "prefill/kv");
  auto decode_engine = LoadOn(decode_te.get(), "decode/kv");
  auto reference_engine = LoadOn(nullptr, "");
  ASSERT_TRUE(prefill_engine && decode_engine && reference_engine);
  auto prefill = serving::MakeLocalBackend(prefill_engine.get(), {.max_batch_tokens = 40});
  auto decode = serving::MakeLocalBackend(decode_engine.get(), {});
  auto reference = serving::MakeLocalBackend(reference_engine.get(), {});
  auto segment = prefill_te->OpenSegment("decode/kv");
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  EXPECT_EQ(*prefill_te->SegmentProtocol(*segment), GetParam());

  std::string text;
  for (int i = 0; i < 10; ++i) text += "Line " + std::to_string(i) + " of a longer prompt. ";
  serving::GenerationRequest req;
  req.id = "req-1";
  req.prompt_tokens = prefill_engine->tokenizer().Encode(text, false, false);
  req.max_tokens = 12;
  req.ignore_eos = true;
  const int n_prompt = static_cast<int>(req.prompt_tokens.size());
  ASSERT_GT(n_prompt, 80);  // several 40-token prefill chunks, several blocks

  auto blocks = decode->ReserveBlocks(req.id, n_prompt + 1, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(blocks.ok());
  KvTarget target{"decode/kv", *blocks, 16, decode_engine->config().n_layers,
                  decode_engine->kv().LayerSliceBytes(), "decode"};
  ASSERT_TRUE(KvPusher::CheckTarget(prefill_engine->kv(), target, n_prompt).ok());
  auto pusher = std::make_shared<KvPusher>(prefill_te.get(), &prefill_engine->kv(), *segment, target,
                                           n_prompt, Clock::now() + std::chrono::seconds(30));
  auto first = req;
  first.max_tokens = 1;
  auto prefill_sink = std::make_shared<Collector>(pusher, req.id);
  ASSERT_TRUE(prefill->SubmitObserved(first, prefill_sink, pusher).ok());
  prefill_sink->Wait();
  ASSERT_TRUE(prefill_sink->push_status_.ok()) << prefill_sink->push_status_.ToString();
  // Every layer of every prompt block went over, some blocks twice (chunk boundaries).
  const uint64_t slices = static_cast<uint64_t>((n_prompt + 15) / 16) * target.n_layers;
  EXPECT_GE(pusher->bytes_sent(), slices * target.layer_slice_bytes);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !notes.empty(); }));
    const auto j = nlohmann::json::parse(notes[0]);
    EXPECT_EQ(j.at("id"), "req-1");
    EXPECT_EQ(j.at("first_token"), prefill_sink->tokens_[0]);
  }
  auto decode_sink = std::make_shared<Collector>();
  ASSERT_TRUE(decode->SubmitPrefilled(req, prefill_sink->tokens_[0], decode_sink).ok());
  decode_sink->Wait();
  std::vector<int32_t> got = {prefill_sink->tokens_[0]};
  got.insert(got.end(), decode_sink->tokens_.begin(), decode_sink->tokens_.end());

  auto ref_sink = std::make_shared<Collector>();
  ASSERT_TRUE(reference->Submit(req, ref_sink).ok());
  ref_sink->Wait();
  EXPECT_EQ(got, ref_sink->tokens_);
}

INSTANTIATE_TEST_SUITE_P(Protocols, KvPusherTest,
                         ::testing::Values(transfer::Protocol::kShm, transfer::Protocol::kTcp),
                         [](const auto& info) { return std::string(transfer::ProtocolName(info.param)); });

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
