#include "conductor/policy/placement.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::conductor {
namespace {

// 1 ms per prompt token, 10 ms decode steps + 1 ms per sequence: easy numbers to reason with.
CostModel Simple() {
  CostModel m;
  m.prefill_per_token_s = 0.001;
  m.decode_base_s = 0.010;
  m.decode_per_seq_s = 0.001;
  return m;
}

WorkerSnapshot Worker(std::string name, WorkerRole role) {
  WorkerSnapshot w;
  w.name = std::move(name);
  w.role = role;
  w.healthy = true;
  w.kv_free_blocks = 1000;
  w.cost = Simple();
  w.kv_transfer_s = 0.005;
  return w;
}

RequestShape Prompt(int tokens) {
  RequestShape r;
  r.prompt_tokens = tokens;
  r.max_tokens = 32;
  r.expected_output_tokens = 32;
  return r;
}

PlacementOptions Opts(PlacementPolicy p = PlacementPolicy::kCacheLoad,
                      AdmissionPolicy a = AdmissionPolicy::kPredictive) {
  PlacementOptions o;
  o.policy = p;
  o.admission = a;
  return o;
}

TEST(PlacementTest, CacheLoadPrefersTheHolderOfTheLongestPrefixWhenIdle) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("p1", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[1].cached_prompt_tokens = 800;
  const Placement p = Place(w, Prompt(1000), Opts());
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_EQ(p.prefill, 1);
  EXPECT_EQ(p.decode, 2);
  EXPECT_FALSE(p.local);
  // 200 uncached tokens at 1 ms + 5 ms transfer.
  EXPECT_NEAR(p.predicted_ttft_s, 0.205, 1e-9);
}

// Colocated (mixed workers only): the prompt is computed where it decodes, so the worker that
// answers first wins: the holder of the prefix when idle, an idle one when the holder is busy.
TEST(PlacementTest, ColocatedPicksTheLowestPredictedTtft) {
  std::vector<WorkerSnapshot> w = {Worker("m0", WorkerRole::kMixed),
                                   Worker("m1", WorkerRole::kMixed)};
  w[1].cached_prompt_tokens = 800;
  Placement p = Place(w, Prompt(1000), Opts());
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_EQ(p.decode, 1);
  EXPECT_TRUE(p.local);
  EXPECT_NEAR(p.predicted_ttft_s, 0.200, 1e-9);  // 200 uncached tokens at 1 ms
  w[1].prefill_queue_s = 2.0;                    // busy with other prompts
  p = Place(w, Prompt(1000), Opts());
  EXPECT_EQ(p.decode, 0);
  EXPECT_NEAR(p.predicted_ttft_s, 1.0, 1e-9);
}

TEST(PlacementTest, CacheLoadLeavesABusyHolderForAnIdleWorker) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("p1", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[1].cached_prompt_tokens = 800;
  w[1].prefill_queue_s = 2.0;  // holder busy: 2.2 s there against 1.0 s recomputing on p0
  const Placement p = Place(w, Prompt(1000), Opts());
  EXPECT_EQ(p.prefill, 0);
  // Cache-aware alone goes to the holder regardless of its predicted queue, until it has more
  // than 2 requests in flight beyond the least loaded worker.
  EXPECT_EQ(Place(w, Prompt(1000), Opts(PlacementPolicy::kCacheAware)).prefill, 1);
  w[1].inflight = 2;
  EXPECT_EQ(Place(w, Prompt(1000), Opts(PlacementPolicy::kCacheAware)).prefill, 1);
  w[1].inflight = 3;
  EXPECT_EQ(Place(w, Prompt(1000), Opts(PlacementPolicy::kCacheAware)).prefill, 0);
  w[1].inflight = 0;
  // Load balance ignores the cache: fewest in flight, then name.
  w[0].inflight = 3;
  EXPECT_EQ(Place(w, Prompt(1000), Opts(PlacementPolicy::kLoadBalance)).prefill, 1);
}

TEST(PlacementTest, RandomUsesTheDraw) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("p1", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  PlacementOptions o = Opts(PlacementPolicy::kRandom);
  o.random_draw = 0;
  EXPECT_EQ(Place(w, Prompt(100), o).prefill, 0);
  o.random_draw = 1;
  EXPECT_EQ(Place(w, Prompt(100), o).prefill, 1);
}

TEST(PlacementTest, NoRoomForKvIsAWaitNotARejection) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[1].kv_free_blocks = 10;  // 1000 tokens need 63 blocks of 16
  Placement p = Place(w, Prompt(1000), Opts());
  EXPECT_EQ(p.outcome, Placement::Outcome::kWait);
  EXPECT_EQ(p.reason, "kv_full");
  // A prefix the decode worker holds needs no fresh blocks: 960 cached tokens leave 3 blocks.
  w[1].cached_prompt_tokens = 960;
  p = Place(w, Prompt(1000), Opts());
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_EQ(p.decode_cached_tokens, 960);
}

TEST(PlacementTest, NoDecodeWorkerIsUnavailable) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[1].healthy = false;
  const Placement p = Place(w, Prompt(10), Opts());
  EXPECT_EQ(p.outcome, Placement::Outcome::kNoWorker);
}

TEST(PlacementTest, TtftSloRejectsBeforeAnyWork) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[0].prefill_queue_s = 3.0;
  w[1].decoding.resize(200, DecodeSequence{100, 0, 10});  // a busy decoder: local is slow too
  RequestShape r = Prompt(1000);
  r.slo_ttft_s = 2.0;
  Placement p = Place(w, r, Opts());
  EXPECT_EQ(p.outcome, Placement::Outcome::kReject);
  EXPECT_EQ(p.reason, "ttft_slo");
  EXPECT_GT(p.retry_after_s, 0);
  // Without admission control the same request is placed (and will queue).
  p = Place(w, r, Opts(PlacementPolicy::kCacheLoad, AdmissionPolicy::kNone));
  EXPECT_EQ(p.outcome, Placement::Outcome::kPlaced);
}

TEST(PlacementTest, PredictiveAdmissionLooksAtTheBatchWhenThePrefillEnds) {
  // The decode worker is full now (30 sequences: 10 + 31 ms > 40 ms with us), but they all end
  // within 0.5 s, before this 1 s prefill is done.
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[1].decoding.resize(30, DecodeSequence{100, 0, 0.5});
  RequestShape r = Prompt(1000);
  r.slo_tbt_s = 0.040;
  PlacementOptions o = Opts(PlacementPolicy::kCacheLoad, AdmissionPolicy::kEarly);
  o.allow_local_prefill = false;
  EXPECT_EQ(Place(w, r, o).outcome, Placement::Outcome::kReject);
  o.admission = AdmissionPolicy::kPredictive;
  Placement p = Place(w, r, o);
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_NEAR(p.predicted_tbt_s, 0.011, 1e-9);  // alone by then
  // Sequences still in prefill that join before us count against us.
  w[1].decoding.assign(30, DecodeSequence{100, 0.2, 5});
  EXPECT_EQ(Place(w, r, o).outcome, Placement::Outcome::kReject);
}

TEST(PlacementTest, DecodeSpreadsOrPacksWithinTheTbtSlo) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode),
                                   Worker("d1", WorkerRole::kDecode)};
  w[1].decoding.resize(5, DecodeSequence{100, 0, 100});
  RequestShape r = Prompt(100);
  EXPECT_EQ(Place(w, r, Opts()).decode, 2);  // no SLO: the emptier one
  r.slo_tbt_s = 0.050;
  EXPECT_EQ(Place(w, r, Opts()).decode, 2);  // by default the lowest predicted TBT
  PlacementOptions pack = Opts();
  pack.pack_decode = true;
  EXPECT_EQ(Place(w, r, pack).decode, 1);  // both meet 50 ms: pack onto the busier
  w[1].decoding.resize(45, DecodeSequence{100, 0, 100});
  EXPECT_EQ(Place(w, r, pack).decode, 2);  // d0 would break it
}

TEST(PlacementTest, LocalPrefillWorkQueuedOnADecoderStretchesItsTbt) {
  WorkerSnapshot d = Worker("d0", WorkerRole::kDecode);
  RequestShape r = Prompt(100);
  r.expected_output_tokens = 10;
  EXPECT_NEAR(PredictTbt(d, r, 0), 0.011, 1e-9);  // alone: one 11 ms step
  // 0.5 s of prompts to compute there: 255-token chunks (255 ms) go into its 10 steps, but
  // only 0.5 s of them exist: +50 ms per token.
  d.prefill_queue_s = 0.5;
  EXPECT_NEAR(PredictTbt(d, r, 0), 0.061, 1e-9);
  // More work than one chunk per step: at most a chunk per token.
  d.prefill_queue_s = 10;
  EXPECT_NEAR(PredictTbt(d, r, 0), 0.011 + 0.255, 1e-9);
  // Joining after the work is done: no interference.
  EXPECT_NEAR(PredictTbt(d, r, 20), 0.011, 1e-9);
}

TEST(PlacementTest, ConditionalDisaggregationComputesShortPromptsLocally) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  w[0].prefill_queue_s = 1.0;  // the prefill worker is backed up
  RequestShape r = Prompt(40);
  r.slo_tbt_s = 0.100;
  Placement p = Place(w, r, Opts());
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_TRUE(p.local);
  EXPECT_EQ(p.prefill, -1);
  EXPECT_NEAR(p.predicted_ttft_s, 0.040, 1e-9);
  // A prompt whose chunk would stretch the decode batch past its TBT SLO stays remote.
  r = Prompt(2000);
  r.slo_tbt_s = 0.100;
  w[1].decoding.resize(4, DecodeSequence{100, 0, 100});
  w[0].prefill_queue_s = 0;
  p = Place(w, r, Opts());
  EXPECT_FALSE(p.local);
  // A short prompt behind prompts already queued on the decode worker: its steps carry whole
  // chunks (252 tokens: 0.25 s with the batch of 4), past the TBT SLO, so it stays remote.
  w[0].prefill_queue_s = 2.0;
  w[1].prefill_queue_s = 0.3;
  r = Prompt(40);
  r.slo_tbt_s = 0.100;
  EXPECT_FALSE(Place(w, r, Opts()).local);
  w[1].prefill_queue_s = 0;
  EXPECT_TRUE(Place(w, r, Opts()).local);
  // Disabled: never local while a prefill worker is up.
  PlacementOptions o = Opts();
  o.allow_local_prefill = false;
  w[0].prefill_queue_s = 1.0;
  EXPECT_FALSE(Place(w, Prompt(40), o).local);
}

TEST(PlacementTest, ExcludedPrefillWorkersAreSkipped) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("p1", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  PlacementOptions o = Opts();
  o.allow_local_prefill = false;
  const int exclude[] = {0};
  EXPECT_EQ(Place(w, Prompt(100), o, exclude).prefill, 1);
  const int both[] = {0, 1};
  const Placement p = Place(w, Prompt(100), o, both);
  EXPECT_TRUE(p.local);  // none left: the decode worker computes it
}

TEST(PlacementTest, WithoutCostModelsPlacementFallsBackToCacheThenLoad) {
  std::vector<WorkerSnapshot> w = {Worker("p0", WorkerRole::kPrefill),
                                   Worker("p1", WorkerRole::kPrefill),
                                   Worker("d0", WorkerRole::kDecode)};
  for (auto& x : w) x.cost = CostModel{};
  w[1].cached_prompt_tokens = 64;
  const Placement p = Place(w, Prompt(100), Opts());
  ASSERT_EQ(p.outcome, Placement::Outcome::kPlaced);
  EXPECT_EQ(p.prefill, 1);
  EXPECT_EQ(p.predicted_ttft_s, 0);
}

TEST(PlacementTest, PolicyNamesRoundTrip) {
  for (auto p : {PlacementPolicy::kRandom, PlacementPolicy::kLoadBalance,
                 PlacementPolicy::kCacheAware, PlacementPolicy::kCacheLoad}) {
    EXPECT_EQ(*ParsePlacementPolicy(PlacementPolicyName(p)), p);
  }
  EXPECT_FALSE(ParsePlacementPolicy("fastest").ok());
  EXPECT_EQ(*ParseAdmissionPolicy("early"), AdmissionPolicy::kEarly);
  EXPECT_FALSE(ParseAdmissionPolicy("").ok());
}

}  // namespace
}  // namespace tandem::conductor
