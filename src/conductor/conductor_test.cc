// The conductor against fake workers: real HTTP servers on loopback speaking the control
// protocol (cluster/protocol.h) without an engine, so that placement, retries, waits for KV
// room, rejection and shutdown are tested deterministically and fast.
#include "conductor/conductor.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "serving/block_keys.h"
#include "store/pool.h"
#include "transfer/metadata.h"

namespace tandem::conductor {
namespace {

using namespace std::chrono_literals;
using cluster::DecodeCall;
using cluster::DecodeEvent;
using cluster::PrefillCall;
using cluster::Role;

constexpr int32_t kFirstToken = 7;

// What the transfer engine's notification does between real workers: the prefill side tells
// the decode side that a request's KV is in place.
class HandoffBoard {
 public:
  void Done(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    done_.insert(id);
    cv_.notify_all();
  }
  bool Wait(const std::string& id, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return done_.count(id) > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> done_;
};

// 1 ms per prompt token, 10 ms decode steps.
CostModel Cost() {
  CostModel m;
  m.prefill_per_token_s = 0.001;
  m.decode_base_s = 0.010;
  m.source = "test";
  return m;
}

class FakeWorker {
 public:
  // layer_windows: per layer, its sliding window in tokens (0: global); empty: none slides.
  FakeWorker(std::shared_ptr<transfer::MetadataStore> md, HandoffBoard* board, std::string name,
             Role role, std::vector<int> layer_windows = {}, int threads = 0, int max_threads = 0)
      : md_(std::move(md)), board_(board) {
    info_.layer_windows = std::move(layer_windows);
    info_.threads = threads;
    info_.max_threads = max_threads;
    this->threads = threads;
    info_.name = std::move(name);
    info_.role = role;
    info_.host = "127.0.0.1";
    info_.kv_segment = info_.name + "/kv";
    info_.block_tokens = 16;
    info_.n_layers = 2;
    info_.layer_slice_bytes = 1024;
    info_.kv_blocks = 1000;
    info_.incarnation = 1;
    info_.cost = Cost();
    server_.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
      cluster::WorkerStats s;
      s.backend.kv_blocks_total = info_.kv_blocks;
      s.backend.engine_threads = this->threads.load();
      std::lock_guard<std::mutex> lock(mu_);
      s.cached_block_keys = cached_keys_;
      s.pool_enabled = !pool_namespace_.empty();
      s.pool_namespace = pool_namespace_;
      res.set_content(s.ToJson(), "application/json");
    });
    server_.Post("/v1/prefill", [this](const httplib::Request& req, httplib::Response& res) {
      auto call = PrefillCall::FromJson(req.body);
      ASSERT_TRUE(call.ok());
      prefills.fetch_add(1);
      if (fail_prefill.load()) {
        res.status = 503;
        res.set_content(cluster::ErrorJson(Unavailable("injected prefill failure")),
                        "application/json");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(call->prompt_tokens.size()));
      board_->Done(call->id);
      cluster::PrefillResult r;
      r.first_token.token = kFirstToken;
      res.set_content(r.ToJson(), "application/json");
    });
    // As a worker does: the engine's count changes, then the published info follows.
    server_.Post("/v1/threads", [this](const httplib::Request& req, httplib::Response& res) {
      auto change = cluster::ThreadsChange::FromJson(req.body);
      ASSERT_TRUE(change.ok());
      std::lock_guard<std::mutex> lock(mu_);
      if (change->threads > info_.max_threads) {
        res.status = 400;
        res.set_content(cluster::ErrorJson(InvalidArgument("above max threads")),
                        "application/json");
        return;
      }
      cluster::ThreadsChangeResult r;
      r.previous = this->threads.exchange(change->threads);
      r.threads = change->threads;
      info_.threads = r.threads;
      EXPECT_TRUE(md_->Put(std::string(cluster::kWorkersPrefix) + info_.name, info_.ToJson()).ok());
      res.set_content(r.ToJson(), "application/json");
    });
    server_.Post("/v1/cancel", [this](const httplib::Request&, httplib::Response& res) {
      cancels.fetch_add(1);
      res.set_content("{}", "application/json");
    });
    server_.Post("/v1/decode", [this](const httplib::Request& req, httplib::Response& res) {
      auto call = DecodeCall::FromJson(req.body);
      ASSERT_TRUE(call.ok());
      decodes.fetch_add(1);
      if (kv_full_answers.load() > 0) {
        kv_full_answers.fetch_sub(1);
        res.status = 429;
        res.set_content(cluster::ErrorJson(ResourceExhausted("no room now")), "application/json");
        return;
      }
      if (call->local) locals.fetch_add(1);
      auto state = std::make_shared<int>(call->local ? 1 : 0);  // 0: reserve, 1: tokens
      auto sent = std::make_shared<int>(call->local ? 0 : 1);   // the prefill sent the first
      res.set_chunked_content_provider("application/x-ndjson", [this, call = *call, state, sent](
                                                                   size_t, httplib::DataSink& out) {
        DecodeEvent e;
        if (*state == 0) {
          e.kind = DecodeEvent::Kind::kReserved;
          e.reserved.segment = info_.kv_segment;
          e.reserved.blocks = {1, 2, 3};
          e.reserved.block_tokens = 16;
          e.reserved.n_layers = 2;
          e.reserved.layer_slice_bytes = 1024;
          e.reserved.decode_worker = info_.name;
          *state = 1;
          const std::string line = e.ToJson() + "\n";
          return out.write(line.data(), line.size());
        }
        if (*sent == 1 && !call.local && !board_->Wait(call.id, 20ms)) {
          return !out.is_writable || out.is_writable();  // keep waiting while connected
        }
        if (*sent < call.max_tokens) {
          std::this_thread::sleep_for(std::chrono::milliseconds(token_delay_ms.load()));
          e.kind = DecodeEvent::Kind::kToken;
          e.token.token = *sent == 0 ? kFirstToken : 100 + *sent;
          ++*sent;
          const std::string line = e.ToJson() + "\n";
          return out.write(line.data(), line.size());
        }
        e.kind = DecodeEvent::Kind::kFinish;
        e.finish.reason = serving::FinishReason::kLength;
        e.finish.completion_tokens = call.max_tokens;
        const std::string line = e.ToJson() + "\n";
        out.write(line.data(), line.size());
        out.done();
        return true;
      });
    });
    info_.port = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(md_->Put(std::string(cluster::kWorkersPrefix) + info_.name, info_.ToJson()).ok());
  }
  ~FakeWorker() {
    server_.stop();
    thread_.join();
  }
  // Leaves the metadata service, as a stopped worker does.
  void Unpublish() {
    EXPECT_TRUE(md_->Delete(std::string(cluster::kWorkersPrefix) + info_.name).ok());
  }
  void SetCachedKeys(std::vector<uint64_t> keys) {
    std::lock_guard<std::mutex> lock(mu_);
    cached_keys_ = std::move(keys);
  }
  void UsePool(std::string ns) {
    std::lock_guard<std::mutex> lock(mu_);
    pool_namespace_ = std::move(ns);
  }

  std::atomic<int> prefills{0}, decodes{0}, locals{0}, cancels{0};
  std::atomic<bool> fail_prefill{false};
  std::atomic<int> kv_full_answers{0};
  std::atomic<int> token_delay_ms{1};
  std::atomic<int> threads{0};  // engine threads (POST /v1/threads changes them)

 private:
  std::shared_ptr<transfer::MetadataStore> md_;
  HandoffBoard* board_;
  cluster::WorkerInfo info_;
  httplib::Server server_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<uint64_t> cached_keys_;
  std::string pool_namespace_;  // empty: no KV pool
};

// A KV pool master that answers only /pool/exist: the first `held` keys are there. Published
// in the metadata service as the real one is.
class FakePoolMaster {
 public:
  // Holds the first `held` keys of each question.
  FakePoolMaster(std::shared_ptr<transfer::MetadataStore> md, int held)
      : FakePoolMaster(md, [held](const std::string&, int i) { return i < held; }) {}
  // Holds the keys for which holds(key, its index in the question) is true.
  FakePoolMaster(std::shared_ptr<transfer::MetadataStore> md,
                 std::function<bool(const std::string&, int)> holds)
      : holds_(std::move(holds)) {
    server_.Post("/pool/exist", [this](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body);
      std::vector<bool> exist;
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& k : body.at("keys")) {
        asked.push_back(k.get<std::string>());
        exist.push_back(holds_(asked.back(), static_cast<int>(exist.size())));
      }
      res.set_content(nlohmann::json{{"exist", exist}}.dump(), "application/json");
    });
    const int port = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(md->Put(store::kMasterKey, "http://127.0.0.1:" + std::to_string(port)).ok());
  }
  ~FakePoolMaster() {
    server_.stop();
    thread_.join();
  }
  std::vector<std::string> Asked() {
    std::lock_guard<std::mutex> lock(mu_);
    return asked;
  }

 private:
  const std::function<bool(const std::string&, int)> holds_;
  httplib::Server server_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> asked;
};

class Sink : public serving::GenerationSink {
 public:
  bool OnToken(const engine::SampledToken& sampled) override {
    const int32_t token = sampled.token;
    tokens.push_back(token);
    return true;
  }
  void OnFinish(const serving::FinishInfo& info) override { done.set_value(info); }
  serving::FinishInfo Wait() {
    auto f = done.get_future();
    EXPECT_EQ(f.wait_for(20s), std::future_status::ready);
    return f.get();
  }
  std::vector<int32_t> tokens;
  std::promise<serving::FinishInfo> done;
};

serving::GenerationRequest Request(const std::string& id, int prompt_tokens, int max_tokens) {
  serving::GenerationRequest r;
  r.id = id;
  for (int i = 0; i < prompt_tokens; ++i) r.prompt_tokens.push_back(i % 50);
  r.max_tokens = max_tokens;
  r.deadline = Clock::now() + 30s;
  return r;
}

double Metric(const serving::BackendStats& s, const std::string& name,
              const std::pair<std::string, std::string>& label = {}) {
  for (const auto& m : s.extra) {
    if (m.name != name) continue;
    if (label.first.empty()) return m.value;
    for (const auto& l : m.labels) {
      if (l == label) return m.value;
    }
  }
  return -1;
}

class ConductorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto md = transfer::OpenMetadataStore(
        std::string("embedded:conductor-test-") +
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(md.ok());
    md_ = *md;
  }
  std::unique_ptr<Conductor> Start(ConductorOptions o, int prefill, int decode) {
    o.metadata = md_;
    o.heartbeat = 20ms;
    auto c = Conductor::Start(o);
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE((*c)->WaitForWorkers(prefill, decode, Clock::now() + 10s).ok());
    return std::move(*c);
  }
  // Until the conductor has seen a worker that reads the KV pool (its /stats say so).
  static void WaitForAPoolWorker(Conductor& c) {
    for (auto until = Clock::now() + 5s; Clock::now() < until;) {
      for (const auto& w : c.Workers()) {
        if (w.stats.pool_enabled) return;
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "no worker with the KV pool in 5 s";
  }
  std::shared_ptr<transfer::MetadataStore> md_;
  HandoffBoard board_;
};

TEST_F(ConductorTest, PlacesOnTheWorkerHoldingThePrefixAndRelaysEveryToken) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker p1(md_, &board_, "prefill-1", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  auto req = Request("r1", 320, 5);
  p1.SetCachedKeys(serving::BlockKeys(req.prompt_tokens, 16));  // p1 holds the whole prompt
  auto c = Start({}, 2, 1);
  // Wait for a heartbeat carrying the keys.
  for (auto until = Clock::now() + 5s; Clock::now() < until;) {
    bool seen = false;
    for (const auto& w : c->Workers())
      seen |= w.info.name == "prefill-1" && !w.stats.cached_block_keys.empty();
    if (seen) break;
    std::this_thread::sleep_for(10ms);
  }
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(req, sink).ok());
  const auto info = sink->Wait();
  EXPECT_EQ(info.reason, serving::FinishReason::kLength);
  EXPECT_EQ(sink->tokens, (std::vector<int32_t>{kFirstToken, 101, 102, 103, 104}));
  EXPECT_EQ(p1.prefills.load(), 1);
  EXPECT_EQ(p0.prefills.load(), 0);
  EXPECT_EQ(Metric(c->Stats(), "tandem_disaggregated_requests_total"), 1);
}

TEST_F(ConductorTest, AFailedPrefillIsRetriedOnAnotherWorker) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker p1(md_, &board_, "prefill-1", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  p0.fail_prefill = true;
  p1.fail_prefill = true;
  auto c = Start({}, 2, 1);
  // Both fail: the decode worker computes the prompt itself (a fallback), after cancelling
  // the reservation.
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(Request("r1", 64, 3), sink).ok());
  EXPECT_EQ(sink->Wait().reason, serving::FinishReason::kLength);
  EXPECT_EQ(p0.prefills.load() + p1.prefills.load(), 2);
  EXPECT_EQ(d0.locals.load(), 1);
  EXPECT_EQ(d0.cancels.load(), 1);
  auto stats = c->Stats();
  EXPECT_EQ(Metric(stats, "tandem_prefill_retries_total"), 1);
  EXPECT_EQ(Metric(stats, "tandem_colocated_fallback_requests_total"), 1);
  // One recovers: the next request is disaggregated again.
  p1.fail_prefill = false;
  auto sink2 = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(Request("r2", 64, 3), sink2).ok());
  EXPECT_EQ(sink2->Wait().reason, serving::FinishReason::kLength);
  EXPECT_EQ(sink2->tokens.size(), 3u);
}

TEST_F(ConductorTest, PredictedSloBreachIsRejectedBeforeAnyWork) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  ConductorOptions o;
  o.slo_ttft_s = 0.100;  // 1,000 prompt tokens are predicted at 1 s
  auto c = Start(o, 1, 1);
  auto sink = std::make_shared<Sink>();
  const Status st = c->Submit(Request("r1", 1000, 3), sink);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("TTFT SLO"), std::string::npos) << st.message();
  EXPECT_GE(c->RetryAfterSeconds(), 1);
  EXPECT_EQ(p0.prefills.load() + d0.decodes.load(), 0);
  EXPECT_EQ(Metric(c->Stats(), "tandem_rejections_total", {"reason", "ttft_slo"}), 1);
  // A request's own, looser SLO admits it; a short prompt meets the server's.
  auto loose = Request("r2", 1000, 3);
  loose.slo_ttft_seconds = 5;
  auto sink2 = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(loose, sink2).ok());
  EXPECT_EQ(sink2->Wait().reason, serving::FinishReason::kLength);
  // Without admission control nothing is rejected.
  o.admission = AdmissionPolicy::kNone;
  auto c2 = Start(o, 1, 1);
  auto sink3 = std::make_shared<Sink>();
  EXPECT_TRUE(c2->Submit(Request("r3", 1000, 2), sink3).ok());
  EXPECT_EQ(sink3->Wait().reason, serving::FinishReason::kLength);
}

TEST_F(ConductorTest, NoKvRoomOnTheDecodeWorkerMeansWaitNotFail) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  d0.kv_full_answers = 2;  // refuses two reservations, then has room
  auto c = Start({}, 1, 1);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(Request("r1", 64, 4), sink).ok());
  const auto info = sink->Wait();
  EXPECT_EQ(info.reason, serving::FinishReason::kLength) << info.message;
  EXPECT_EQ(sink->tokens.size(), 4u);
  EXPECT_EQ(d0.decodes.load(), 3);
  EXPECT_EQ(p0.prefills.load(), 1);
}

TEST_F(ConductorTest, WithoutDecodeWorkersRequestsAreUnavailable) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  auto c = Start({}, 1, 0);
  auto sink = std::make_shared<Sink>();
  const Status st = c->Submit(Request("r1", 10, 2), sink);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(Metric(c->Stats(), "tandem_rejections_total", {"reason", "no_decode_worker"}), 1);
}

TEST_F(ConductorTest, DestroyingTheConductorEndsRequestsInFlight) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  d0.token_delay_ms = 50;  // 1,000 tokens would take 50 s
  auto c = Start({}, 1, 1);
  std::vector<std::shared_ptr<Sink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<Sink>());
    ASSERT_TRUE(c->Submit(Request("r" + std::to_string(i), 32, 1000), sinks.back()).ok());
  }
  std::this_thread::sleep_for(300ms);
  const auto start = Clock::now();
  c.reset();  // joins every request thread
  EXPECT_LT(Clock::now() - start, 5s);
  for (auto& s : sinks) {
    auto f = s->done.get_future();
    ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
    EXPECT_EQ(f.get().reason, serving::FinishReason::kCancelled);
    EXPECT_GT(s->tokens.size(), 0u);
  }
}

// Global cache-aware placement: neither prefill worker holds the prompt, but the KV pool holds
// it and only prefill-1 reads the pool: prefill-1 is predicted to fetch instead of compute and
// wins; without pool awareness the two tie and the first by name (prefill-0) would.
TEST_F(ConductorTest, APrefillWorkerThatReadsThePoolIsPredictedToFetchWhatThePoolHolds) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker p1(md_, &board_, "prefill-1", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  p1.UsePool("model:L2");
  FakePoolMaster master(md_, /*held=*/1000);
  auto c = Start({}, 2, 1);
  WaitForAPoolWorker(*c);
  auto req = Request("r1", 320, 3);
  const auto keys = serving::BlockKeys(req.prompt_tokens, 16);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(req, sink).ok());
  EXPECT_EQ(sink->Wait().reason, serving::FinishReason::kLength);
  EXPECT_EQ(p1.prefills.load(), 1);
  EXPECT_EQ(p0.prefills.load(), 0);
  // It asked for the prompt's whole blocks but the last token's, in the worker's namespace.
  const auto asked = master.Asked();
  ASSERT_EQ(asked.size(), 19u);  // (320 - 1) / 16
  EXPECT_EQ(asked[0], store::ObjectKey("model:L2", keys[0]));
  const auto stats = c->Stats();
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_lookups_total"), 1);
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_predicted_tokens_total"), 19 * 16);
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_lookup_failures_total"), 0);

  // pool_aware off: the tie goes to prefill-0.
  ConductorOptions off;
  off.pool_aware = false;
  auto c2 = Start(off, 2, 1);
  auto sink2 = std::make_shared<Sink>();
  ASSERT_TRUE(c2->Submit(Request("r2", 320, 3), sink2).ok());
  EXPECT_EQ(sink2->Wait().reason, serving::FinishReason::kLength);
  EXPECT_EQ(p0.prefills.load(), 1);
}

// Sliding-window models: the pool holds every block of the prompt, but the windows (sliding
// layers' KV) only of blocks 52..55, behind the end of block 56 (a 64-token window: a sequence
// resuming at block n reads blocks n - 4 .. n - 1). A worker would read the prefix up to block 56
// only, and that is what the conductor predicts.
TEST_F(ConductorTest, ASlidingWindowPrefixIsPredictedOnlyUpToAnEndWithItsWindows) {
  const std::vector<int> windows = {64, 0};  // layer 0 slides over 64 tokens, layer 1 is global
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill, windows);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode, windows);
  p0.UsePool("model:L2");
  auto req = Request("r1", 1000, 3);
  const auto keys = serving::BlockKeys(req.prompt_tokens, 16);
  std::set<std::string> held_windows;
  for (int b = 52; b < 56; ++b) {
    held_windows.insert(store::ObjectKey(store::WindowNamespace("model:L2"), keys[b]));
  }
  FakePoolMaster master(md_, [&](const std::string& key, int) {
    return key.find(":window/") == std::string::npos || held_windows.count(key) > 0;
  });
  auto c = Start({}, 1, 1);
  WaitForAPoolWorker(*c);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(c->Submit(req, sink).ok());
  EXPECT_EQ(sink->Wait().reason, serving::FinishReason::kLength);
  const auto stats = c->Stats();
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_lookups_total"), 1);
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_predicted_tokens_total"), 56 * 16);
  EXPECT_EQ(Metric(stats, "tandem_conductor_pool_lookup_failures_total"), 0);
}

// --planner-hook: with both pools idle the planner offers an idle prefill worker for removal,
// and the conductor runs the orchestrator's command with the request in its environment (at
// most once per dwell time), counting how it ended.
TEST_F(ConductorTest, ThePlannerAsksTheOrchestratorHookToRemoveAnIdleWorker) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill);
  FakeWorker p1(md_, &board_, "prefill-1", Role::kPrefill);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode);
  const std::string out = ::testing::TempDir() + "/planner-hook-" + std::to_string(::getpid());
  std::remove(out.c_str());
  ConductorOptions o;
  o.elastic = true;
  o.planner_interval = 20ms;
  o.planner.dwell_s = 0.5;
  o.planner.remove_idle_s = 0.5;  // the fake workers never compute: idle since they joined
  o.planner_hook =
      "echo \"$TANDEM_PLANNER_REQUEST $TANDEM_PLANNER_WORKER "
      "$TANDEM_PLANNER_DECODE_WORKERS\" >> '" +
      out + "'";
  auto c = Start(o, 2, 1);
  std::string lines;
  for (auto until = Clock::now() + 10s; Clock::now() < until;) {
    std::ifstream in(out);
    lines.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (Metric(c->Stats(), "tandem_planner_hook_calls_total", {"outcome", "ok"}) >= 1) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(lines.substr(0, lines.find('\n')), "remove prefill-0 1") << lines;
  EXPECT_GE(Metric(c->Stats(), "tandem_planner_hook_calls_total", {"request", "remove"}), 1);
  // At most once per dwell time: in ~0.6 s, at most two runs.
  std::this_thread::sleep_for(600ms);
  std::ifstream in(out);
  int runs = 0;
  for (std::string line; std::getline(in, line);) ++runs;
  EXPECT_LE(runs, 3);
  std::remove(out.c_str());
}

// Elastic pools on one host: a starting worker's core is taken back from a running one at once
// and held until the newcomer joins (the planner does not hand it back meanwhile); a worker that
// leaves frees its cores, which the thread planner gives to the workers still running.
TEST_F(ConductorTest, TheThreadPlannerKeepsTheWorkersWithinTheCoreBudget) {
  FakeWorker p0(md_, &board_, "prefill-0", Role::kPrefill, {}, 2, 4);
  FakeWorker d0(md_, &board_, "decode-0", Role::kDecode, {}, 2, 4);
  ConductorOptions o;
  o.elastic = true;
  o.planner_interval = 20ms;
  o.core_budget = 4;
  o.thread_planner.dwell_s = 0;
  auto c = Start(o, 1, 1);
  auto sum = [&] { return p0.threads.load() + d0.threads.load(); };
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(sum(), 4);  // the budget is full and the pools idle: nothing moves

  EXPECT_EQ(c->ReserveCores(1, 10s), 1);
  EXPECT_EQ(sum(), 3);  // one worker gave a thread back before the call returned
  EXPECT_EQ(Metric(c->Stats(), "tandem_planner_cores_reserved"), 1);
  EXPECT_GE(Metric(c->Stats(), "tandem_thread_changes_total", {"reason", "over_budget"}), 1);
  std::this_thread::sleep_for(300ms);  // ~15 plans
  EXPECT_EQ(sum(), 3);                 // the reserved core stays free
  // Four more asked: the workers go down to one thread each, which frees one (held briefly).
  EXPECT_EQ(c->ReserveCores(4, 200ms), 1);
  EXPECT_EQ(sum(), 2);
  std::this_thread::sleep_for(300ms);  // that hold lapses; the first is held still
  EXPECT_EQ(sum(), 3);                 // the planner gave the lapsed core back

  {
    FakeWorker p1(md_, &board_, "prefill-1", Role::kPrefill, {}, 1, 4);
    ASSERT_TRUE(c->WaitForWorkers(2, 1, Clock::now() + 10s).ok());
    // It joined: the reservation is met, and the budget is full again.
    for (auto until = Clock::now() + 5s;
         Clock::now() < until && Metric(c->Stats(), "tandem_planner_cores_reserved") != 0;) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(Metric(c->Stats(), "tandem_planner_cores_reserved"), 0);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(sum() + p1.threads.load(), 4);
    p1.Unpublish();
  }
  // It left: its core goes to the workers still running.
  for (auto until = Clock::now() + 5s; Clock::now() < until && sum() != 4;) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(sum(), 4);
  EXPECT_GE(Metric(c->Stats(), "tandem_thread_changes_total", {"reason", "spare_cores"}), 1);
  EXPECT_EQ(Metric(c->Stats(), "tandem_planner_core_budget"), 4);
}

}  // namespace
}  // namespace tandem::conductor
