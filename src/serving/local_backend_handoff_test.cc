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

std::unique_ptr<engine::Engine> LoadEngine() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  engine::EngineOptions o;
  o.model_path = std::string(dir ? dir : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.threads = 1;
  o.kv_capacity_tokens = 4096;
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

class Collector : public GenerationSink {
 public:
  bool OnToken(int32_t token) override {
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
// blocks: what the transfer engine does across processes. Records which positions it saw.
class CopyingObserver : public KvObserver {
 public:
  CopyingObserver(engine::PagedKvCache* from, engine::PagedKvCache* to,
                  std::vector<int32_t> to_blocks)
      : from_(from), to_(to), to_blocks_(std::move(to_blocks)) {
    sent_upto_.assign(from->shape().n_layers, 0);
  }
  void OnLayerWritten(int layer, std::span<const int32_t> blocks, int first_pos,
                      int end_pos) override {
    const int bt = from_->shape().block_tokens;
    // Blocks not sent yet for this layer, including a cached prefix (positions < first_pos).
    const int first_block = sent_upto_[layer] / bt;
    const int end_block = (end_pos + bt - 1) / bt;
    for (int b = first_block; b < end_block; ++b) {
      std::memcpy(to_->data() + to_->LayerSliceOffset(to_blocks_[b], layer),
                  from_->data() + from_->LayerSliceOffset(blocks[b], layer),
                  from_->LayerSliceBytes());
    }
    sent_upto_[layer] = end_pos;
    if (layer == 0) min_first_pos_ = std::min(min_first_pos_, first_pos);
  }
  int min_first_pos() const { return min_first_pos_; }

 private:
  engine::PagedKvCache* from_;
  engine::PagedKvCache* to_;
  std::vector<int32_t> to_blocks_;
  std::vector<int> sent_upto_;  // per layer: positions already copied
  int min_first_pos_ = 1 << 30;
};

struct Pair {
  std::unique_ptr<engine::Engine> prefill_engine, decode_engine;
  std::unique_ptr<LocalBackend> prefill, decode;
};

Pair MakePair() {
  Pair p;
  p.prefill_engine = LoadEngine();
  p.decode_engine = LoadEngine();
  if (!p.prefill_engine || !p.decode_engine) return p;
  p.prefill = MakeLocalBackend(p.prefill_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  p.decode = MakeLocalBackend(p.decode_engine.get(), {.max_num_seqs = 8, .max_batch_tokens = 48});
  return p;
}

// Runs one request the disaggregated way; returns every generated token.
std::vector<int32_t> Handoff(Pair& p, GenerationRequest req, int* cached_prefix = nullptr) {
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

TEST(HandoffTest, DisaggregatedEqualsColocatedGreedyAndSeeded) {
  Pair p = MakePair();
  ASSERT_TRUE(p.prefill && p.decode);
  auto colocated_engine = LoadEngine();
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

TEST(HandoffTest, CachedPrefixOnThePrefillSideIsSentToo) {
  Pair p = MakePair();
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
  auto colocated_engine = LoadEngine();
  ASSERT_NE(colocated_engine, nullptr);
  auto colocated = MakeLocalBackend(colocated_engine.get(), {});
  EXPECT_EQ(out_b, Colocated(*colocated, b));
}

TEST(HandoffTest, ReservationsExpireAreCancelledAndRefuseBadUse) {
  Pair p = MakePair();
  ASSERT_TRUE(p.prefill && p.decode);
  const int free_before = p.decode->Stats().kv_blocks_total - p.decode->Stats().kv_blocks_used;
  auto r1 = p.decode->ReserveBlocks("x", 100, Clock::now() + std::chrono::milliseconds(200));
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->size(), 7u);  // ceil(100 / 16)
  EXPECT_EQ(
      p.decode->ReserveBlocks("x", 10, Clock::now() + std::chrono::seconds(5)).status().code(),
      StatusCode::kInvalidArgument);  // the same id twice
  auto r2 = p.decode->ReserveBlocks("y", 40, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(r2.ok());
  std::set<int32_t> all(r1->begin(), r1->end());
  all.insert(r2->begin(), r2->end());
  EXPECT_EQ(all.size(), r1->size() + r2->size());  // disjoint
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

TEST(HandoffTest, FirstTokenThatEndsTheRequestFinishesAtOnce) {
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

}  // namespace
}  // namespace tandem::serving
