#include "serving/local_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

namespace tandem::serving {
namespace {

std::string ModelPath() {
  const char* s = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(s ? s : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::unique_ptr<engine::Engine> Load(engine::EngineOptions o) {
  o.threads = 2;
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

std::unique_ptr<engine::Engine> LoadEngine(int kv_tokens) {
  engine::EngineOptions o;
  o.model_path = ModelPath();
  o.kv_capacity_tokens = kv_tokens;
  return Load(o);
}

// Gemma 3 (sliding-window layers), its window arena sized for max_sequences sequences.
std::unique_ptr<engine::Engine> LoadGemma(int max_sequences, int max_step_tokens,
                                          int kv_capacity_tokens = 4096) {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  engine::EngineOptions o;
  o.model_path = std::string(dir ? dir : ".") + "/models/gemma-3-270m-q4_k_m.gguf";
  o.kv_capacity_tokens = kv_capacity_tokens;
  o.max_sequences = max_sequences;
  o.max_step_tokens = max_step_tokens;
  return Load(o);
}

// Collects a request's tokens; cancels after `cancel_after` tokens when set.
class CollectingSink : public GenerationSink {
 public:
  explicit CollectingSink(int cancel_after = -1) : cancel_after_(cancel_after) {}
  bool OnToken(const engine::SampledToken& sampled) override {
    const int32_t token = sampled.token;
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(token);
    return cancel_after_ < 0 || static_cast<int>(tokens_.size()) < cancel_after_;
  }
  void OnFinish(const FinishInfo& info) override { done_.set_value(info); }
  FinishInfo Wait() { return done_.get_future().get(); }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }

 private:
  int cancel_after_;
  std::mutex mu_;
  std::vector<int32_t> tokens_;
  std::promise<FinishInfo> done_;
};

GenerationRequest Greedy(const engine::Engine& e, const std::string& text, int max_tokens) {
  GenerationRequest r;
  r.id = text.substr(0, 12);
  r.prompt_tokens = e.tokenizer().Encode(text, false, false);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<std::string> Prompts(int n) {
  std::vector<std::string> p;
  for (int i = 0; i < n; ++i) {
    p.push_back("Request " + std::to_string(i) + ": write a short note about the number " +
                std::to_string(i * 37 + 11) + (i % 2 ? " and its digits." : " in French."));
  }
  return p;
}

// Submits every request at once and returns each one's tokens once all have finished (each by
// reaching max_tokens).
std::vector<std::vector<int32_t>> SubmitAll(LocalBackend& backend,
                                            const std::vector<GenerationRequest>& reqs) {
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<CollectingSink>());
    EXPECT_TRUE(backend.Submit(r, sinks.back()).ok());
  }
  std::vector<std::vector<int32_t>> outputs;
  for (auto& sink : sinks) {
    EXPECT_EQ(sink->Wait().reason, FinishReason::kLength);
    outputs.push_back(sink->tokens());
  }
  return outputs;
}

// What the engine produces for a prompt alone, without the scheduler.
std::vector<int32_t> Solo(engine::Engine& e, const GenerationRequest& r) {
  engine::GenerateOptions g;
  g.max_tokens = r.max_tokens;
  g.ignore_eos = true;
  return e.Generate(r.prompt_tokens, g, nullptr)->tokens;
}

TEST(LocalBackendTest, ConcurrentRequestsGetTheirSoloOutput) {
  auto e = LoadEngine(8192);
  ASSERT_NE(e, nullptr);
  const auto prompts = Prompts(12);
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : prompts) solo.push_back(Solo(*e, Greedy(*e, p, 12)));
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 8, .max_batch_tokens = 64});
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const auto& p : prompts) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(backend->Submit(Greedy(*e, p, 12), sinks.back()).ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const FinishInfo info = sinks[i]->Wait();
    EXPECT_EQ(info.reason, FinishReason::kLength);
    EXPECT_EQ(info.completion_tokens, 12);
    EXPECT_EQ(sinks[i]->tokens(), solo[i]) << prompts[i];
  }
  backend->Drain(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(backend->Stats().running, 0);
}

// A stream resumed elsewhere (the conductor's request migration): the prompt plus the output
// already sent, counted as output by the sampler, continues exactly where it stopped: greedy,
// and seeded sampling with penalties (each draw's seed is its position; penalties count the
// resumed output).
TEST(LocalBackendTest, ResumedOutputContinuesTheSameStream) {
  auto e = LoadEngine(8192);
  ASSERT_NE(e, nullptr);
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 4, .max_batch_tokens = 64});
  for (bool sampled : {false, true}) {
    GenerationRequest whole = Greedy(*e, "The harbour at dawn was quiet, and", 24);
    if (sampled) {
      whole.sampling.temperature = 0.9f;
      whole.sampling.top_p = 0.95f;
      whole.sampling.seed = 1234;
      whole.sampling.frequency_penalty = 0.7f;
      whole.sampling.presence_penalty = 0.4f;
    }
    const std::vector<int32_t> full = SubmitAll(*backend, {whole})[0];
    ASSERT_EQ(full.size(), 24u);
    for (int k : {1, 9, 23}) {
      GenerationRequest rest = whole;
      rest.id = "resumed-" + std::to_string(k);
      rest.resumed_output.assign(full.begin(), full.begin() + k);
      const std::vector<int32_t> tail = SubmitAll(*backend, {rest})[0];
      EXPECT_EQ(tail, std::vector<int32_t>(full.begin() + k, full.end()))
          << (sampled ? "sampled" : "greedy") << ", resumed after " << k;
    }
  }
  GenerationRequest bad = Greedy(*e, "x", 4);
  bad.resumed_output = {1, 2, 3, 4};  // nothing left to draw
  EXPECT_EQ(backend->Submit(bad, std::make_shared<CollectingSink>()).code(),
            StatusCode::kInvalidArgument);
  backend->Drain(Clock::now() + std::chrono::seconds(5));
}

TEST(LocalBackendTest, BusyTimeAndTokensAreCountedByPhase) {
  auto e = LoadEngine(4096);
  ASSERT_NE(e, nullptr);
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 4, .max_batch_tokens = 32});
  const BackendStats before = backend->Stats();
  EXPECT_EQ(before.engine_threads, 2);
  EXPECT_EQ(before.busy_seconds_prefill + before.busy_seconds_decode, 0.0);
  std::vector<GenerationRequest> reqs = {Greedy(*e, Prompts(2)[0], 9),
                                         Greedy(*e, Prompts(2)[1], 5)};
  reqs[1].id = "second";
  const Clock::time_point start = Clock::now();
  SubmitAll(*backend, reqs);
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const BackendStats s = backend->Stats();
  // Every prompt token is computed once (chunks of up to 32); each generated token but the
  // last is fed back once as a decode token.
  EXPECT_EQ(s.computed_tokens_prefill,
            static_cast<int64_t>(reqs[0].prompt_tokens.size() + reqs[1].prompt_tokens.size()));
  EXPECT_EQ(s.computed_tokens_decode, (9 - 1) + (5 - 1));
  EXPECT_GT(s.busy_seconds_prefill, 0.0);
  EXPECT_GT(s.busy_seconds_decode, 0.0);
  // Forward passes are a part of the wall time the requests took.
  EXPECT_LE(s.busy_seconds_prefill + s.busy_seconds_decode, wall);
}

// Elastic pools resize a running engine: while a batch generates, its thread count moves
// between 1 and max_threads step by step, and every output is token for token what a run at a
// fixed count gave (the kernels are thread-count invariant). Busy core-seconds count each
// step's threads; a count outside [1, max_threads] is refused.
TEST(LocalBackendTest, EngineThreadsChangeWhileGenerating) {
  engine::EngineOptions o;
  o.model_path = ModelPath();
  o.kv_capacity_tokens = 4096;
  o.threads = 2;
  o.max_threads = 3;
  auto loaded = engine::Engine::Load(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::unique_ptr<engine::Engine> e = std::move(*loaded);
  // No prefix cache: the second run computes every prompt again, under the resizes.
  auto backend = MakeLocalBackend(
      e.get(), {.max_num_seqs = 4, .max_batch_tokens = 16, .enable_prefix_cache = false});
  EXPECT_EQ(backend->Stats().engine_threads, 2);
  EXPECT_EQ(backend->Stats().engine_max_threads, 3);
  std::vector<GenerationRequest> reqs;
  for (const std::string& p : Prompts(3)) {
    reqs.push_back(Greedy(*e, p, 24));
    reqs.back().id = "fixed-" + std::to_string(reqs.size());
  }
  const std::vector<std::vector<int32_t>> fixed = SubmitAll(*backend, reqs);

  std::atomic<bool> done{false};
  std::atomic<int> resizes{0};
  std::thread resizer([&] {
    for (int i = 0; !done.load(); ++i) {
      const int threads = 1 + i % 3;  // 1, 2, 3, 1, ...
      EXPECT_TRUE(backend->SetEngineThreads(threads).ok());
      ++resizes;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (auto& r : reqs) r.id = "resized-" + r.id;
  const BackendStats before = backend->Stats();
  const std::vector<std::vector<int32_t>> resized = SubmitAll(*backend, reqs);
  done = true;
  resizer.join();
  EXPECT_GT(resizes.load(), 3);
  EXPECT_EQ(resized, fixed);

  const BackendStats after = backend->Stats();
  const double busy = (after.busy_seconds_prefill + after.busy_seconds_decode) -
                      (before.busy_seconds_prefill + before.busy_seconds_decode);
  const double core_busy = (after.busy_core_seconds_prefill + after.busy_core_seconds_decode) -
                           (before.busy_core_seconds_prefill + before.busy_core_seconds_decode);
  // Each step ran on 1 to 3 threads (the microsecond counts round each step down).
  EXPECT_GE(core_busy, busy * 1 - 1e-3);
  EXPECT_LE(core_busy, busy * 3 + 1e-3);

  EXPECT_EQ(backend->SetEngineThreads(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->SetEngineThreads(4).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(backend->SetEngineThreads(3).ok());
  EXPECT_EQ(backend->Stats().engine_threads, 3);
  backend->Drain(Clock::now() + std::chrono::seconds(5));
}

// Work outside the scheduler runs on the loop thread between steps with the engine to itself:
// requests running meanwhile keep their outputs, the work's time counts as prefill, and work
// whose deadline passes before the loop gets to it never runs.
TEST(LocalBackendTest, ExclusiveWorkRunsBetweenSteps) {
  auto e = LoadEngine(4096);
  ASSERT_NE(e, nullptr);
  std::vector<GenerationRequest> reqs = {Greedy(*e, Prompts(2)[0], 12)};
  const std::vector<int32_t> solo = Solo(*e, reqs[0]);
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 4, .max_batch_tokens = 32});
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(backend->Submit(reqs[0], sink).ok());
  // A forward pass of its own over blocks it allocates and frees.
  const std::vector<int32_t> prompt = reqs[0].prompt_tokens;
  std::vector<float> logits;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  Status st = backend->RunExclusive(
      [&](LocalBackend::ExclusiveAccess& access) -> Status {
        engine::Engine& engine = access.engine();
        TANDEM_ASSIGN_OR_RETURN(auto blocks,
                                access.AllocateBlocks(engine.kv().BlocksFor(prompt.size())));
        engine::BatchItem item{blocks, 0, prompt, true};
        const Status forward = engine.transformer().Forward({&item, 1}, engine.kv(), &logits);
        engine.kv().Release(blocks);
        return forward;
      },
      static_cast<int64_t>(prompt.size()), deadline);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(engine::Argmax(logits), solo[0]);
  EXPECT_EQ(sink->Wait().reason, FinishReason::kLength);
  EXPECT_EQ(sink->tokens(), solo);
  // Its status comes back; a passed deadline means it never ran.
  EXPECT_EQ(
      backend
          ->RunExclusive([](LocalBackend::ExclusiveAccess&) { return DataLoss("no"); }, 0, deadline)
          .code(),
      StatusCode::kDataLoss);
  bool ran = false;
  const Status late = backend->RunExclusive(
      [&](LocalBackend::ExclusiveAccess&) {
        ran = true;
        return OkStatus();
      },
      0, Clock::now() - std::chrono::seconds(1));
  if (!late.ok()) {
    EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded);
    EXPECT_FALSE(ran);
  }
  EXPECT_GE(backend->Stats().computed_tokens_prefill, static_cast<int64_t>(2 * prompt.size()));
}

// Exclusive work takes KV memory the way the scheduler does: blocks the prefix cache holds
// are evicted for it when too few are free.
TEST(LocalBackendTest, ExclusiveWorkEvictsCachedPrefixes) {
  auto e = LoadEngine(512);  // 32 blocks of 16
  ASSERT_NE(e, nullptr);
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 4, .max_batch_tokens = 64});
  GenerationRequest r = Greedy(*e, Prompts(1)[0], 4);
  while (r.prompt_tokens.size() < 300) r.prompt_tokens.push_back(r.prompt_tokens.back());
  SubmitAll(*backend, {r});  // the prompt's blocks stay cached
  int free_before = 0;
  const Status st = backend->RunExclusive(
      [&](LocalBackend::ExclusiveAccess& access) -> Status {
        free_before = access.engine().kv().num_free();
        TANDEM_ASSIGN_OR_RETURN(auto blocks, access.AllocateBlocks(30));
        access.engine().kv().Release(blocks);
        EXPECT_EQ(access.AllocateBlocks(33).status().code(), StatusCode::kResourceExhausted);
        return OkStatus();
      },
      0, Clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(free_before, 30);  // nothing runs: the rest were held by the prefix cache
}

TEST(LocalBackendTest, SharedPrefixIsServedFromCacheWithSameOutput) {
  auto e = LoadEngine(4096);
  ASSERT_NE(e, nullptr);
  std::string context;
  for (int i = 0; i < 20; ++i)
    context += "Paragraph " + std::to_string(i) + " of the shared manual text. ";
  const auto a = Greedy(*e, context + "Question one?", 8);
  const auto b = Greedy(*e, context + "Question two?", 8);
  const auto solo_b = Solo(*e, b);
  auto backend = MakeLocalBackend(e.get(), {});
  auto first = std::make_shared<CollectingSink>();
  ASSERT_TRUE(backend->Submit(a, first).ok());
  EXPECT_EQ(first->Wait().cached_prompt_tokens, 0);
  auto second = std::make_shared<CollectingSink>();
  ASSERT_TRUE(backend->Submit(b, second).ok());
  const FinishInfo info = second->Wait();
  EXPECT_GT(info.cached_prompt_tokens, 100);
  EXPECT_LT(info.cached_prompt_tokens, static_cast<int>(b.prompt_tokens.size()));
  EXPECT_EQ(second->tokens(), solo_b);
  EXPECT_EQ(backend->Stats().prefix_cache_hit_tokens, info.cached_prompt_tokens);
}

// KV memory pressure: 4 requests of 100 tokens on a cache of 20 blocks of 16 tokens, where each
// request needs about 8. Returns the requests and each one's output alone.
constexpr int kPressureBlocks = 20;
std::pair<std::vector<GenerationRequest>, std::vector<std::vector<int32_t>>> PressureWorkload(
    engine::Engine& e) {
  std::vector<GenerationRequest> reqs;
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : Prompts(4)) {
    reqs.push_back(Greedy(e, p, 100));
    solo.push_back(Solo(e, reqs.back()));
  }
  return {reqs, solo};
}

// A KV cache far too small for all requests at once: sequences are preempted and recomputed,
// nobody is killed, outputs are unchanged, and every block comes back.
TEST(LocalBackendTest, PreemptionUnderMemoryPressureKeepsOutputs) {
  auto e = LoadEngine(kPressureBlocks * 16);
  ASSERT_NE(e, nullptr);
  const auto [reqs, solo] = PressureWorkload(*e);
  auto backend = MakeLocalBackend(
      e.get(), {.max_num_seqs = 4, .max_batch_tokens = 64, .enable_prefix_cache = false});
  const auto outputs = SubmitAll(*backend, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& got = outputs[i];
    size_t d = 0;
    while (d < got.size() && d < solo[i].size() && got[d] == solo[i][d]) ++d;
    EXPECT_EQ(got, solo[i]) << i << " first difference at " << d;
  }
  EXPECT_GT(backend->Stats().preemptions, 0);
  backend->Drain(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(backend->Stats().kv_blocks_used, 0);
}

// A KV pool in this process's memory: a block's global-arena bytes under its key, and (sliding
// models) a window block's bytes under the key of the block that held it.
class MemoryKvPool : public KvPool {
 public:
  explicit MemoryKvPool(engine::PagedKvCache* kv) : kv_(kv) {}
  // Reads into and offers from another engine's cache (of the same model) from now on.
  void Retarget(engine::PagedKvCache* kv) { kv_ = kv; }
  int Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override {
    const int n = Read(objects_, keys, blocks, [this](int32_t b) { return Block(b); });
    fetched_blocks += n;
    return n;
  }
  void Offer(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override {
    Write(objects_, keys, blocks, kv_->BlockBytes(), [this](int32_t b) { return Block(b); });
  }
  std::vector<bool> HeldWindows(std::span<const uint64_t> keys) override {
    std::vector<bool> held;
    for (uint64_t k : keys) held.push_back(windows_.count(k) > 0);
    return held;
  }
  int FetchWindows(std::span<const uint64_t> keys,
                   std::span<const int32_t> window_blocks) override {
    const int n = Read(windows_, keys, window_blocks, [this](int32_t w) { return Window(w); });
    fetched_windows += n;
    return n;
  }
  void OfferWindows(std::span<const uint64_t> keys,
                    std::span<const int32_t> window_blocks) override {
    Write(windows_, keys, window_blocks, kv_->shape().WindowBlockBytes(),
          [this](int32_t w) { return Window(w); });
  }
  int windows_held() const { return static_cast<int>(windows_.size()); }
  int fetched_blocks = 0;
  int fetched_windows = 0;

 private:
  using Objects = std::map<uint64_t, std::vector<char>>;
  static int Read(const Objects& from, std::span<const uint64_t> keys, std::span<const int32_t> ids,
                  const std::function<char*(int32_t)>& at) {
    int n = 0;
    for (; n < static_cast<int>(keys.size()); ++n) {
      auto it = from.find(keys[n]);
      if (it == from.end()) break;
      std::memcpy(at(ids[n]), it->second.data(), it->second.size());
    }
    return n;
  }
  static void Write(Objects& to, std::span<const uint64_t> keys, std::span<const int32_t> ids,
                    size_t bytes, const std::function<char*(int32_t)>& at) {
    for (size_t i = 0; i < keys.size(); ++i) to[keys[i]].assign(at(ids[i]), at(ids[i]) + bytes);
  }
  char* Block(int32_t b) const {
    return reinterpret_cast<char*>(kv_->data()) + static_cast<size_t>(b) * kv_->BlockBytes();
  }
  char* Window(int32_t w) const {
    return reinterpret_cast<char*>(kv_->data()) + kv_->WindowArenaOffset() +
           static_cast<size_t>(w) * kv_->shape().WindowBlockBytes();
  }
  engine::PagedKvCache* kv_;
  Objects objects_;
  Objects windows_;
};

// Under the same pressure with a KV pool: a preempted sequence's KV goes to the pool and comes
// back from it (or from the prefix cache while that still holds it) instead of being
// recomputed; outputs are unchanged, and every preempted token is accounted for.
TEST(LocalBackendTest, PreemptedKvIsOffloadedToThePoolAndResumedFromIt) {
  auto e = LoadEngine(kPressureBlocks * 16);
  ASSERT_NE(e, nullptr);
  const auto [reqs, solo] = PressureWorkload(*e);
  auto pool = std::make_shared<MemoryKvPool>(&e->kv());
  auto backend =
      MakeLocalBackend(e.get(), {.max_num_seqs = 4, .max_batch_tokens = 64, .kv_pool = pool});
  EXPECT_EQ(SubmitAll(*backend, reqs), solo);
  const BackendStats st = backend->Stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.preempt_offloaded_tokens, 0);
  EXPECT_GT(st.preempt_resumed_pool_tokens, 0);
  EXPECT_GT(pool->fetched_blocks, 0);
  // A preempted sequence holds at most one partial block (< 16 tokens) that no cache keeps.
  EXPECT_LT(st.preempt_recomputed_tokens, 16 * st.preemptions);
}

// A pool much slower than computing (a fetch of a 16-token block sleeps 250 ms; the engine
// computes one in a few ms): once a few blocks have been fetched and measured, prompts the pool
// holds are recomputed instead of read from it, with the same outputs, and the skips are
// counted. A pool as fast as memory keeps being read (the test above).
class SlowKvPool : public MemoryKvPool {
 public:
  using MemoryKvPool::MemoryKvPool;
  int Fetch(std::span<const uint64_t> keys, std::span<const int32_t> blocks) override {
    const int n = MemoryKvPool::Fetch(keys, blocks);
    std::this_thread::sleep_for(std::chrono::milliseconds(250) * std::max(n, 1));
    return n;
  }
};

TEST(LocalBackendTest, ASlowPoolIsNotReadWhenComputingIsCheaper) {
  auto writer_engine = LoadEngine(4096);
  auto reader_engine = LoadEngine(4096);
  ASSERT_NE(writer_engine, nullptr);
  ASSERT_NE(reader_engine, nullptr);
  // The same model in both: a block's bytes are the same, whichever cache holds it.
  auto pool = std::make_shared<SlowKvPool>(&writer_engine->kv());
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Greedy(*writer_engine, Prompts(4)[i] + " " + Prompts(4)[(i + 1) % 4], 4);
    while (r.prompt_tokens.size() < 200) r.prompt_tokens.push_back(r.prompt_tokens[0]);
    r.id = "shared-" + std::to_string(i);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> solo;
  for (const auto& r : reqs) solo.push_back(Solo(*writer_engine, r));
  {
    auto writer = MakeLocalBackend(writer_engine.get(),
                                   {.max_num_seqs = 4, .max_batch_tokens = 64, .kv_pool = pool});
    EXPECT_EQ(SubmitAll(*writer, reqs), solo);  // the pool now holds every prompt's blocks
  }
  // The reader's pool reads go into its own cache.
  auto reader_pool = std::make_shared<SlowKvPool>(*pool);
  reader_pool->Retarget(&reader_engine->kv());
  auto reader = MakeLocalBackend(
      reader_engine.get(), {.max_num_seqs = 1, .max_batch_tokens = 64, .kv_pool = reader_pool});
  // First a prompt the pool lacks, so that the reader's compute time is measured over a whole
  // prompt (its first steps also fault the weights in).
  GenerationRequest fresh = reqs[0];
  fresh.id = "fresh";
  for (int32_t& t : fresh.prompt_tokens) t = (t + 1) % 1000;
  SubmitAll(*reader, {fresh});
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(SubmitAll(*reader, {reqs[i]}), (std::vector<std::vector<int32_t>>{solo[i]}));
  }
  const BackendStats st = reader->Stats();
  // The first prompt was read from the pool (12 blocks: measured); the next ones were not.
  EXPECT_EQ(st.pool_hit_tokens, 12 * 16);
  EXPECT_EQ(st.pool_fetches_skipped, 3);
}

// Gemma 3's sliding layers keep KV only for their 512-token window, in an arena sized for two
// sequences; three long prompts at once outgrow it, so the scheduler waits or preempts (never
// fails), outputs equal each prompt alone, and every window block comes back at the end.
TEST(LocalBackendTest, SlidingWindowArenaUnderPressureKeepsOutputs) {
  auto loaded = LoadGemma(/*max_sequences=*/2, /*max_step_tokens=*/64);
  ASSERT_NE(loaded, nullptr);
  engine::Engine& e = *loaded;
  const engine::PagedKvCache& kv = e.kv();
  ASSERT_GT(kv.shape().NumSlidingLayers(), 0);
  EXPECT_EQ(kv.num_window_blocks(), kv.shape().WindowBlocksFor(2, 64));
  std::vector<GenerationRequest> reqs;
  std::vector<std::vector<int32_t>> solo;
  for (int r = 0; r < 3; ++r) {
    std::string text;
    for (int i = 0; i < 60; ++i)
      text += "Note " + std::to_string(r) + "." + std::to_string(i) + " on tides. ";
    reqs.push_back(Greedy(e, text, 40));  // long enough to decode while the others prefill
    reqs.back().id = "long-" + std::to_string(r);
    ASSERT_GT(reqs.back().prompt_tokens.size(), 512u);
    solo.push_back(Solo(e, reqs.back()));
  }
  EXPECT_EQ(kv.num_free_window(), kv.num_window_blocks());  // Generate gave everything back
  auto backend = MakeLocalBackend(&e, {.max_num_seqs = 3, .max_batch_tokens = 64});
  const auto outputs = SubmitAll(*backend, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(outputs[i], solo[i]) << i;
  EXPECT_GT(backend->Stats().preemptions, 0);  // the arena did run short
  EXPECT_EQ(backend->Stats().kv_window_blocks_total, kv.num_window_blocks());
  backend.reset();  // the prefix cache's references go too
  EXPECT_EQ(kv.num_free(), kv.num_blocks());
  EXPECT_EQ(kv.num_free_window(), kv.num_window_blocks());
}

// A long prompt asked again is served from the prefix cache although the first run's decode
// moved its window on: the window behind the prompt's end stays pinned in the cache.
TEST(LocalBackendTest, SlidingWindowPrefixIsResumableAfterDecode) {
  auto loaded = LoadGemma(/*max_sequences=*/4, /*max_step_tokens=*/256);
  ASSERT_NE(loaded, nullptr);
  engine::Engine& e = *loaded;
  std::string text;
  for (int i = 0; i < 70; ++i) text += "Entry " + std::to_string(i) + " in the ship's log. ";
  const auto req = Greedy(e, text, 40);  // 40 tokens: the window moves past the prompt's end
  ASSERT_GT(req.prompt_tokens.size(), 600u);
  auto backend = MakeLocalBackend(&e, {.max_num_seqs = 4, .max_batch_tokens = 256});
  auto first = std::make_shared<CollectingSink>();
  ASSERT_TRUE(backend->Submit(req, first).ok());
  EXPECT_EQ(first->Wait().cached_prompt_tokens, 0);
  auto second = std::make_shared<CollectingSink>();
  ASSERT_TRUE(backend->Submit(req, second).ok());
  const FinishInfo info = second->Wait();
  EXPECT_GE(info.cached_prompt_tokens, static_cast<int>(req.prompt_tokens.size()) - 16);
  EXPECT_EQ(second->tokens(), first->tokens());
}

// Gemma 3 with a KV pool: a long prompt (and its answer) computed by one engine is read from
// the pool by another: the global blocks, and the windows behind the prompt's end and behind
// the answer's end, which the writer offered when it finished. Outputs equal each prompt
// computed alone. A prompt that shares only the first 320 tokens reads nothing: the pool holds
// no window behind that shorter prefix, so not even its blocks are read in vain.
TEST(LocalBackendTest, SlidingWindowPrefixesComeFromThePool) {
  auto writer_engine = LoadGemma(/*max_sequences=*/2, /*max_step_tokens=*/128);
  auto reader_engine = LoadGemma(/*max_sequences=*/2, /*max_step_tokens=*/128);
  ASSERT_NE(writer_engine, nullptr);
  ASSERT_NE(reader_engine, nullptr);
  const engine::PagedKvCache& kv = reader_engine->kv();
  ASSERT_GT(kv.shape().NumSlidingLayers(), 0);
  std::string text;
  for (int i = 0; i < 70; ++i) text += "Entry " + std::to_string(i) + " in the ship's log. ";
  GenerationRequest first = Greedy(*writer_engine, text, 24);
  const int prompt = static_cast<int>(first.prompt_tokens.size());
  ASSERT_GT(prompt, 700);  // past the 512-token window
  // Resuming it leaves its last token to compute: the end is the prompt's last full block
  // when the prompt does not end on a block boundary.
  ASSERT_NE(prompt % 16, 0);
  auto pool = std::make_shared<MemoryKvPool>(&writer_engine->kv());
  std::vector<int32_t> answer;
  {
    auto writer = MakeLocalBackend(writer_engine.get(),
                                   {.max_num_seqs = 2, .max_batch_tokens = 128, .kv_pool = pool});
    answer = SubmitAll(*writer, {first})[0];
  }
  ASSERT_EQ(answer.size(), 24u);
  // Windows behind the prompt's end (pinned by the prefix cache) and behind the answer's end.
  EXPECT_GE(pool->windows_held(), 33);

  GenerationRequest next = first;  // the next turn: prompt, answer, a new question
  next.id = "next";
  next.prompt_tokens.insert(next.prompt_tokens.end(), answer.begin(), answer.end());
  for (int32_t t : Greedy(*writer_engine, " And the weather?", 1).prompt_tokens)
    next.prompt_tokens.push_back(t);
  GenerationRequest branch = first;  // shares the first 320 tokens only
  branch.id = "branch";
  branch.prompt_tokens.resize(320);
  for (int32_t t : Greedy(*writer_engine, " A different story begins here.", 1).prompt_tokens)
    branch.prompt_tokens.push_back(t);
  const std::vector<int32_t> solo_first = Solo(*reader_engine, first);
  const std::vector<int32_t> solo_next = Solo(*reader_engine, next);
  const std::vector<int32_t> solo_branch = Solo(*reader_engine, branch);
  EXPECT_EQ(answer, solo_first);

  auto reader_pool = std::make_shared<MemoryKvPool>(*pool);
  reader_pool->Retarget(&reader_engine->kv());
  // A reader's own prefix cache lives as long as its backend: a new backend starts empty.
  std::unique_ptr<LocalBackend> reader;
  const auto fresh_reader = [&] {
    reader.reset();
    reader = MakeLocalBackend(reader_engine.get(),
                              {.max_num_seqs = 1, .max_batch_tokens = 128, .kv_pool = reader_pool});
  };
  const auto run = [&](const GenerationRequest& r, std::vector<int32_t>* out) {
    auto sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE(reader->Submit(r, sink).ok());
    const int cached = sink->Wait().cached_prompt_tokens;
    *out = sink->tokens();
    return cached;
  };
  std::vector<int32_t> out;
  fresh_reader();
  EXPECT_EQ(run(branch, &out), 0);
  EXPECT_EQ(out, solo_branch);
  EXPECT_EQ(reader_pool->fetched_blocks, 0);  // no window behind block 20: nothing read
  // The next turn: its first 20 blocks from the reader's own cache (branch's), the rest up to
  // the answer's end from the pool, with the windows behind that end.
  EXPECT_GE(run(next, &out), prompt + 24 - 16);
  EXPECT_EQ(out, solo_next);
  EXPECT_GE(reader->Stats().pool_hit_tokens, prompt + 24 - 16 - 320);
  EXPECT_EQ(reader->Stats().pool_window_misses, 0);
  // The first prompt on an empty reader: up to the prompt's end from the pool, where the
  // writer's prefix cache had pinned the window.
  fresh_reader();
  EXPECT_GE(run(first, &out), prompt - 16);
  EXPECT_EQ(out, solo_first);
  EXPECT_GE(reader->Stats().pool_hit_tokens, prompt - 16);
  const BackendStats st = reader->Stats();
  EXPECT_GT(reader_pool->fetched_windows, 0);
  EXPECT_EQ(st.pool_window_misses, 0);
  reader.reset();
  EXPECT_EQ(kv.num_free(), kv.num_blocks());
  EXPECT_EQ(kv.num_free_window(), kv.num_window_blocks());
}

// Gemma 3 with a KV pool, three long prompts on a KV cache that holds them but not their
// answers (the window arena holds three windows): a preempted sequence offers its blocks and the
// windows behind its end, and resumes from the pool at that end (or from what the prefix cache
// still holds) instead of recomputing; outputs are unchanged.
TEST(LocalBackendTest, SlidingWindowPreemptionResumesFromThePool) {
  auto reference = LoadGemma(/*max_sequences=*/1, /*max_step_tokens=*/64);
  ASSERT_NE(reference, nullptr);
  std::vector<GenerationRequest> reqs;
  std::vector<std::vector<int32_t>> solo;
  int prompt_blocks = 0;
  for (int r = 0; r < 3; ++r) {
    std::string text;
    for (int i = 0; i < 60; ++i)
      text += "Note " + std::to_string(r) + "." + std::to_string(i) + " on tides. ";
    reqs.push_back(Greedy(*reference, text, 40));
    reqs.back().id = "long-" + std::to_string(r);
    ASSERT_GT(reqs.back().prompt_tokens.size(), 512u);
    prompt_blocks += static_cast<int>(reqs.back().prompt_tokens.size()) / 16 + 1;
    solo.push_back(Solo(*reference, reqs.back()));
  }
  // Room for the three prompts, not for their answers (40 tokens: 2-3 blocks each).
  auto loaded = LoadGemma(/*max_sequences=*/3, /*max_step_tokens=*/64,
                          /*kv_capacity_tokens=*/(prompt_blocks + 2) * 16);
  ASSERT_NE(loaded, nullptr);
  engine::Engine& e = *loaded;
  auto pool = std::make_shared<MemoryKvPool>(&e.kv());
  auto backend = MakeLocalBackend(&e, {.max_num_seqs = 3, .max_batch_tokens = 64, .kv_pool = pool});
  EXPECT_EQ(SubmitAll(*backend, reqs), solo);
  const BackendStats st = backend->Stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.preempt_offloaded_tokens, 0);
  EXPECT_GT(pool->windows_held(), 0);
  EXPECT_GT(st.preempt_resumed_pool_tokens, 0);
  EXPECT_EQ(st.pool_window_misses, 0);
  // A preempted sequence holds at most one partial block (< 16 tokens) that no cache keeps.
  EXPECT_LT(st.preempt_recomputed_tokens, 16 * st.preemptions);
}

TEST(LocalBackendTest, CancelTimeoutAndRefusals) {
  auto e = LoadEngine(2048);
  ASSERT_NE(e, nullptr);
  auto backend = MakeLocalBackend(e.get(), {.max_waiting = 2, .enable_prefix_cache = false});
  auto cancelled = std::make_shared<CollectingSink>(/*cancel_after=*/3);
  ASSERT_TRUE(backend->Submit(Greedy(*e, "Count to one hundred:", 50), cancelled).ok());
  const FinishInfo c = cancelled->Wait();
  EXPECT_EQ(c.reason, FinishReason::kCancelled);
  EXPECT_EQ(c.completion_tokens, 3);

  auto late = std::make_shared<CollectingSink>();
  auto r = Greedy(*e, "Too late", 5);
  r.deadline = Clock::now() - std::chrono::seconds(1);
  ASSERT_TRUE(backend->Submit(r, late).ok());
  EXPECT_EQ(late->Wait().reason, FinishReason::kTimeout);

  auto empty = Greedy(*e, "x", 5);
  empty.prompt_tokens.clear();
  EXPECT_EQ(backend->Submit(empty, std::make_shared<CollectingSink>()).code(),
            StatusCode::kInvalidArgument);
  auto huge = Greedy(*e, "x", 5);
  huge.prompt_tokens.assign(3000, 100);  // more than the 2048-token KV cache
  const Status too_long = backend->Submit(huge, std::make_shared<CollectingSink>());
  EXPECT_EQ(too_long.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.message().find("3000"), std::string::npos);

  backend->Drain(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(backend->Stats().kv_blocks_used, 0);
  EXPECT_EQ(backend->Submit(Greedy(*e, "after", 2), std::make_shared<CollectingSink>()).code(),
            StatusCode::kFailedPrecondition);
}

TEST(LocalBackendTest, FullQueueIsRefused) {
  auto e = LoadEngine(2048);
  ASSERT_NE(e, nullptr);
  auto backend = MakeLocalBackend(e.get(), {.max_num_seqs = 1, .max_waiting = 2});
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    const Status st = backend->Submit(Greedy(*e, "Story " + std::to_string(i), 40), sinks.back());
    if (st.code() == StatusCode::kResourceExhausted) {
      ++refused;
      sinks.pop_back();
    }
  }
  EXPECT_GT(refused, 0);
  for (auto& s : sinks) EXPECT_EQ(s->Wait().reason, FinishReason::kLength);
}

}  // namespace
}  // namespace tandem::serving
