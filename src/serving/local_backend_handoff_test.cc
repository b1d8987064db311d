// The hooks of disaggregation, without processes or sockets: one engine prefills with a
// KvObserver that copies each layer's KV into blocks reserved on a second engine, which then
// continues the generation. The result must equal one engine doing everything.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "serving/local_backend.h"

namespace tandem::serving {
namespace {

constexpr const char* kSmolLm2 = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kGemma = "gemma-3-270m-q4_k_m.gguf";  // sliding-window layers

std::unique_ptr<engine::Engine> LoadEngine(const std::string& file = kSmolLm2,
                                           int kv_tokens = 4096) {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  engine::EngineOptions o;
  o.model_path = std::string(dir ? dir : ".") + "/models/" + file;
  o.threads = 1;
  o.kv_capacity_tokens = kv_tokens;
  // The window arena as a server with these scheduler settings sizes it (MakePair).
  o.max_sequences = 8;
  o.max_step_tokens = 48;
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

class Collector : public GenerationSink {
 public:
  bool OnToken(const engine::SampledToken& sampled) override {
    const int32_t token = sampled.token;
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(token);
    return true;
  }
  void OnFinish(const FinishInfo& info) override { done_.set_value(info); }
  FinishInfo Wait() { return done_.get_future().get(); }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }

 private:
  std::mutex mu_;
  std::vector<int32_t> tokens_;
  std::promise<FinishInfo> done_;
};

// Copies every written layer slice from the prefill cache into the decode cache's reserved
// blocks: what the transfer engine does across processes (sliding layers only where the decode
// side keeps a window). Records which positions it saw and how many sliding slices it copied.
class CopyingObserver : public KvObserver {
 public:
  CopyingObserver(engine::PagedKvCache* from, engine::PagedKvCache* to,
                  LocalBackend::Reserved target)
      : from_(from), to_(to), target_(std::move(target)) {
    sent_upto_.assign(from->shape().n_layers, 0);
  }
  void OnLayerWritten(int layer, std::span<const int32_t> blocks, int first_pos,
                      int end_pos) override {
    const int bt = from_->shape().block_tokens;
    // Blocks not sent yet for this layer, including a cached prefix (positions < first_pos).
    const int first_block = sent_upto_[layer] / bt;
    const int end_block = (end_pos + bt - 1) / bt;
    const bool sliding = from_->shape().IsSliding(layer);
    for (int b = first_block; b < end_block; ++b) {
      if (sliding && target_.window_blocks.at(b) < 0) continue;
      std::memcpy(to_->data() + to_->LayerSliceOffset(target_.blocks[b], layer),
                  from_->data() + from_->LayerSliceOffset(blocks[b], layer),
                  from_->LayerSliceBytes());
      sliding_copied_ += sliding;
    }
    sent_upto_[layer] = end_pos;
    if (layer == 0) min_first_pos_ = std::min(min_first_pos_, first_pos);
  }
  int min_first_pos() const { return min_first_pos_; }
  int sliding_copied() const { return sliding_copied_; }

 private:
  engine::PagedKvCache* from_;
  engine::PagedKvCache* to_;
  LocalBackend::Reserved target_;
  int sliding_copied_ = 0;
  std::vector<int> sent_upto_;  // per layer: positions already copied
  int min_first_pos_ = 1 << 30;
};

struct Pair {
  std::unique_ptr<engine::Engine> prefill_engine, decode_engine;
  std::unique_ptr<LocalBackend> prefill, decode;
};

Pair MakePair(const std::string& file = kSmolLm2) {
  Pair p;
  p.prefill_engine = LoadEngine(file);
  p.decode_engine = LoadEngine(file);
  if (!p.prefill_engine || !p.decode_engine) return p;
  p.prefill = MakeLocalBackend(p.prefill_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  p.decode = MakeLocalBackend(p.decode_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  return p;
}

// Runs one request the disaggregated way; returns every generated token.
std::vector<int32_t> Handoff(Pair& p, GenerationRequest req, int* cached_prefix = nullptr,
                             int* sliding_copied = nullptr) {
  const int n_prompt = static_cast<int>(req.prompt_tokens.size());
  auto reserved =
      p.decode->ReserveBlocks(req.id, n_prompt + 1, Clock::now() + std::chrono::seconds(60));
  EXPECT_TRUE(reserved.ok()) << reserved.status().ToString();
  if (!reserved.ok()) return {};
  auto observer =
      std::make_shared<CopyingObserver>(&p.prefill_engine->kv(), &p.decode_engine->kv(), *reserved);
  GenerationRequest first = req;
  first.max_tokens = 1;
  auto prefill_sink = std::make_shared<Collector>();
  EXPECT_TRUE(p.prefill->SubmitObserved(first, prefill_sink, observer).ok());
  const FinishInfo pinfo = prefill_sink->Wait();
  EXPECT_EQ(pinfo.completion_tokens, 1);
  if (cached_prefix) *cached_prefix = pinfo.cached_prompt_tokens;
  EXPECT_EQ(observer->min_first_pos(), pinfo.cached_prompt_tokens);
  if (sliding_copied) *sliding_copied = observer->sliding_copied();
  const int32_t first_token = prefill_sink->tokens().at(0);
  auto decode_sink = std::make_shared<Collector>();
  const Status st = p.decode->SubmitPrefilled(req, first_token, decode_sink);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return {};
  const FinishInfo dinfo = decode_sink->Wait();
  EXPECT_EQ(dinfo.completion_tokens, req.max_tokens);
  std::vector<int32_t> out = {first_token};
  for (int32_t t : decode_sink->tokens()) out.push_back(t);
  return out;
}

std::vector<int32_t> Colocated(LocalBackend& b, GenerationRequest req) {
  auto sink = std::make_shared<Collector>();
  EXPECT_TRUE(b.Submit(req, sink).ok());
  sink->Wait();
  return sink->tokens();
}

GenerationRequest Request(const engine::Engine& e, const std::string& id, const std::string& text,
                          int max_tokens, float temperature = 0) {
  GenerationRequest r;
  r.id = id;
  r.prompt_tokens = e.tokenizer().Encode(text, false, false);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = 99;
  return r;
}

// Both models: SmolLM2 (every layer global) and Gemma 3 (sliding-window layers).
class HandoffTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HandoffTest, DisaggregatedEqualsColocatedGreedyAndSeeded) {
  Pair p = MakePair(GetParam());
  ASSERT_TRUE(p.prefill && p.decode);
  auto colocated_engine = LoadEngine(GetParam());
  ASSERT_NE(colocated_engine, nullptr);
  auto colocated =
      MakeLocalBackend(colocated_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  std::string long_text;
  for (int i = 0; i < 12; ++i)
    long_text += "Paragraph " + std::to_string(i) + " talks about rivers. ";
  const std::vector<std::pair<std::string, float>> cases = {
      {"Hi", 0.0f},  // shorter than one block
      {"The capital of France is", 0.0f},
      {long_text, 0.0f},                 // several prefill chunks (48-token steps)
      {long_text + " And seas.", 0.8f},  // sampled: the decode side continues the seed
  };
  int i = 0;
  for (const auto& [text, temperature] : cases) {
    const auto req = Request(*p.prefill_engine, "r" + std::to_string(i++), text, 10, temperature);
    EXPECT_EQ(Handoff(p, req), Colocated(*colocated, req)) << text.substr(0, 40);
  }
  // The prefill side's prefix cache served part of the last prompt: the observer still had to
  // send those blocks, and the output is unchanged (checked above).
  EXPECT_EQ(p.decode->Stats().reserved_blocks, 0);
}

TEST_P(HandoffTest, CachedPrefixOnThePrefillSideIsSentToo) {
  Pair p = MakePair(GetParam());
  ASSERT_TRUE(p.prefill && p.decode);
  std::string text;
  for (int i = 0; i < 8; ++i)
    text += "A shared system prompt sentence number " + std::to_string(i) + ". ";
  const auto a = Request(*p.prefill_engine, "a", text + "Question one?", 6);
  const auto b = Request(*p.prefill_engine, "b", text + "Question two?", 6);
  Handoff(p, a);
  int cached = 0;
  const auto out_b = Handoff(p, b, &cached);
  EXPECT_GT(cached, 0);  // b's prefix came from the prefill side's cache
  auto colocated_engine = LoadEngine(GetParam());
  ASSERT_NE(colocated_engine, nullptr);
  auto colocated = MakeLocalBackend(colocated_engine.get(), {});
  EXPECT_EQ(out_b, Colocated(*colocated, b));
}

INSTANTIATE_TEST_SUITE_P(Models, HandoffTest, ::testing::Values(kSmolLm2, kGemma),
                         [](const auto& info) { return info.index == 0 ? "SmolLM2" : "Gemma3"; });

// A prompt longer than Gemma's 512-token window: the prefill side gives back the sliding
// layers' KV as its chunks move on, the decode side receives only the last window of it, and
// the continuation still equals one engine doing everything.
TEST(HandoffWindowTest, OnlyTheLastWindowOfSlidingLayersIsHandedOff) {
  Pair p = MakePair(kGemma);
  ASSERT_TRUE(p.prefill && p.decode);
  std::string text;
  for (int i = 0; i < 90; ++i) text += "Line " + std::to_string(i) + " of the river survey. ";
  const auto req = Request(*p.prefill_engine, "long", text, 8);
  const int n_prompt = static_cast<int>(req.prompt_tokens.size());
  ASSERT_GT(n_prompt, 700);  // past the 512-token window
  int sliding_copied = 0;
  const auto disaggregated = Handoff(p, req, nullptr, &sliding_copied);
  auto colocated_engine = LoadEngine(kGemma);
  ASSERT_NE(colocated_engine, nullptr);
  auto colocated =
      MakeLocalBackend(colocated_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  EXPECT_EQ(disaggregated, Colocated(*colocated, req));
  // Every sliding layer got the blocks of the window behind position n_prompt, plus a resend of
  // a block a 48-token chunk left partly filled; far fewer than all the prompt's blocks.
  const auto& shape = p.decode_engine->kv().shape();
  const int window_blocks = (shape.window_tokens + 15) / 16 + 1;
  const int chunks = (n_prompt + 47) / 48;
  EXPECT_LE(sliding_copied, (window_blocks + chunks) * shape.NumSlidingLayers());
  EXPECT_GE(sliding_copied, (window_blocks - 1) * shape.NumSlidingLayers());
  EXPECT_LT(sliding_copied, (n_prompt / 16) * shape.NumSlidingLayers());  // the whole prompt
  // Both engines hold sliding KV only for windows now, never a whole prompt.
  const auto& pkv = p.prefill_engine->kv();
  EXPECT_LE(pkv.num_window_blocks() - pkv.num_free_window(), 2 * window_blocks);
}

TEST(HandoffReservationTest, ReservationsExpireAreCancelledAndRefuseBadUse) {
  Pair p = MakePair();
  ASSERT_TRUE(p.prefill && p.decode);
  const int free_before = p.decode->Stats().kv_blocks_total - p.decode->Stats().kv_blocks_used;
  auto r1 = p.decode->ReserveBlocks("x", 100, Clock::now() + std::chrono::milliseconds(200));
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->blocks.size(), 7u);  // ceil(100 / 16)
  EXPECT_EQ(
      p.decode->ReserveBlocks("x", 10, Clock::now() + std::chrono::seconds(5)).status().code(),
      StatusCode::kInvalidArgument);  // the same id twice
  auto r2 = p.decode->ReserveBlocks("y", 40, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(r2.ok());
  std::set<int32_t> all(r1->blocks.begin(), r1->blocks.end());
  all.insert(r2->blocks.begin(), r2->blocks.end());
  EXPECT_EQ(all.size(), r1->blocks.size() + r2->blocks.size());  // disjoint
  EXPECT_EQ(p.decode->ReserveBlocks("z", 1 << 20, Clock::now()).status().code(),
            StatusCode::kOutOfRange);
  // "x" expires on its own.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (p.decode->Stats().reservations_expired == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(p.decode->Stats().reservations_expired, 1);
  auto req = Request(*p.decode_engine, "x", "hello there", 4);
  EXPECT_EQ(p.decode->SubmitPrefilled(req, 42, std::make_shared<Collector>()).code(),
            StatusCode::kNotFound);
  // "y" is cancelled explicitly; every block comes back.
  p.decode->CancelReservation("y");
  const auto deadline2 = Clock::now() + std::chrono::seconds(5);
  while (p.decode->Stats().reserved_blocks != 0 && Clock::now() < deadline2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(p.decode->Stats().reserved_blocks, 0);
  EXPECT_EQ(p.decode->Stats().kv_blocks_total - p.decode->Stats().kv_blocks_used, free_before);
}

TEST(HandoffReservationTest, FirstTokenThatEndsTheRequestFinishesAtOnce) {
  Pair p = MakePair();
  ASSERT_TRUE(p.prefill && p.decode);
  auto req = Request(*p.decode_engine, "one", "hello there", 1);
  ASSERT_TRUE(p.decode->ReserveBlocks("one", 20, Clock::now() + std::chrono::seconds(30)).ok());
  auto sink = std::make_shared<Collector>();
  ASSERT_TRUE(p.decode->SubmitPrefilled(req, 42, sink).ok());
  const FinishInfo info = sink->Wait();
  EXPECT_EQ(info.reason, FinishReason::kLength);
  EXPECT_EQ(info.completion_tokens, 1);
  EXPECT_TRUE(sink->tokens().empty());
}

// A request that waits for memory at the head of the queue, with nothing running, must not
// block prefilled sequences behind it that already hold their KV: they run, finish, and free
// the memory it waits for (before, the decode side spun in its loop with all of them stuck).
TEST(HandoffQueueTest, PrefilledSequencesRunWhileAnEarlierRequestWaitsForMemory) {
  Pair p;
  p.prefill_engine = LoadEngine(kSmolLm2);
  p.decode_engine = LoadEngine(kSmolLm2, /*kv_tokens=*/96);  // 6 blocks of 16
  ASSERT_TRUE(p.prefill_engine && p.decode_engine);
  p.prefill = MakeLocalBackend(p.prefill_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  p.decode = MakeLocalBackend(p.decode_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  const auto a = Request(*p.prefill_engine, "a", "The capital of France is", 6);
  const int n_a = static_cast<int>(a.prompt_tokens.size());
  ASSERT_LE(n_a + 6, 16);  // one block holds it to the end
  auto reserved = p.decode->ReserveBlocks("a", n_a + 1, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  ASSERT_EQ(reserved->blocks.size(), 1u);

  // 88 prompt tokens + 4: six blocks, and only five are free while "a" holds one.
  GenerationRequest big;
  big.id = "big";
  for (int i = 0; i < 88; ++i) big.prompt_tokens.push_back(500 + i);
  big.max_tokens = 4;
  big.ignore_eos = true;
  auto big_sink = std::make_shared<Collector>();
  ASSERT_TRUE(p.decode->Submit(big, big_sink).ok());

  auto observer =
      std::make_shared<CopyingObserver>(&p.prefill_engine->kv(), &p.decode_engine->kv(), *reserved);
  GenerationRequest first = a;
  first.max_tokens = 1;
  auto prefill_sink = std::make_shared<Collector>();
  ASSERT_TRUE(p.prefill->SubmitObserved(first, prefill_sink, observer).ok());
  prefill_sink->Wait();
  auto a_sink = std::make_shared<Collector>();
  ASSERT_TRUE(p.decode->SubmitPrefilled(a, prefill_sink->tokens().at(0), a_sink).ok());

  auto a_done = std::async(std::launch::async, [&] { return a_sink->Wait(); });
  ASSERT_EQ(a_done.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the prefilled sequence never ran";
  EXPECT_EQ(a_done.get().completion_tokens, a.max_tokens);
  auto big_done = std::async(std::launch::async, [&] { return big_sink->Wait(); });
  ASSERT_EQ(big_done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const FinishInfo info = big_done.get();
  EXPECT_EQ(info.completion_tokens, 4) << info.message;
}

// A running sequence that needs one more block while a reservation for pushed KV holds the
// rest of the cache: it used to end with "the KV cache cannot hold this sequence"; now it gives
// its blocks up, waits until the reservation is gone, and finishes with the output it has alone.
// A sequence that cannot fit even alone still gets that error.
TEST(HandoffQueueTest, ASequenceThatOutgrowsTheCacheWaitsForAReservationsBlocks) {
  auto reference = LoadEngine(kSmolLm2);
  auto engine = LoadEngine(kSmolLm2, /*kv_tokens=*/96);  // 6 blocks of 16
  ASSERT_TRUE(reference && engine);
  GenerationRequest grow;
  grow.id = "grow";
  for (int i = 0; i < 50; ++i) grow.prompt_tokens.push_back(700 + i);  // 4 blocks
  grow.max_tokens = 20;                                                // 70 tokens: 5 blocks
  grow.ignore_eos = true;
  std::vector<int32_t> alone;
  {
    auto backend = MakeLocalBackend(reference.get(), {.max_batch_tokens = 48});
    auto sink = std::make_shared<Collector>();
    ASSERT_TRUE(backend->Submit(grow, sink).ok());
    ASSERT_EQ(sink->Wait().completion_tokens, 20);
    alone = sink->tokens();
  }
  auto decode = MakeLocalBackend(engine.get(), {.max_batch_tokens = 48});
  // Two blocks reserved for a push that never comes: 4 + 2 of 6 taken once "grow" runs.
  ASSERT_TRUE(decode->ReserveBlocks("held", 32, Clock::now() + std::chrono::seconds(60)).ok());
  auto sink = std::make_shared<Collector>();
  ASSERT_TRUE(decode->Submit(grow, sink).ok());
  // It runs until position 64 needs a fifth block, then waits for the reservation's.
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (decode->Stats().preemptions == 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(decode->Stats().preemptions, 0);
  decode->CancelReservation("held");
  const FinishInfo info = sink->Wait();
  EXPECT_EQ(info.reason, FinishReason::kLength) << info.message;
  EXPECT_EQ(sink->tokens(), alone);

  // 50 + 60 tokens need 7 blocks of a 6-block cache: nothing else holds any, so it fails.
  GenerationRequest too_long = grow;
  too_long.id = "too-long";
  too_long.max_tokens = 60;
  auto sink2 = std::make_shared<Collector>();
  ASSERT_TRUE(decode->Submit(too_long, sink2).ok());
  const FinishInfo failed = sink2->Wait();
  EXPECT_EQ(failed.reason, FinishReason::kError);
  EXPECT_NE(failed.message.find("cannot hold"), std::string::npos) << failed.message;
}

}  // namespace
}  // namespace tandem::serving
