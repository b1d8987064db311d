#include "sim/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "sim/report.h"

namespace tandem::sim {
namespace {

using conductor::AdmissionPolicy;
using conductor::PlacementPolicy;

// A small engine with round numbers: prefill 1 ms per token (+ attention), decode steps of
// 20 ms + 1 ms per sequence + 1 us per context token; 64-token blocks.
InstanceProfile SmallProfile() {
  InstanceProfile p;
  p.cost.prefill_base_s = 0.002;
  p.cost.prefill_per_token_s = 0.001;
  p.cost.prefill_attention_s = 1e-8;
  p.cost.decode_base_s = 0.02;
  p.cost.decode_per_seq_s = 0.001;
  p.cost.decode_per_context_token_s = 1e-6;
  p.kv_capacity_tokens = 64 * 1024;
  p.block_tokens = 64;
  p.max_batch_tokens = 256;
  p.prefix_cache_tokens = 64 * 1024;
  p.kv_bytes_per_token = 1000;
  p.layers = 10;
  p.link_bytes_per_s = 1e8;  // 100 MB/s: a 1000-token prompt's KV takes 10 ms
  p.link_latency_s = 1e-4;
  return p;
}

SimRequest Request(int index, double at, int input, int output, uint64_t key_base) {
  SimRequest r;
  r.index = index;
  r.arrival_s = at;
  r.input_tokens = input;
  r.output_tokens = output;
  for (int b = 0; b < (input + 63) / 64; ++b) r.keys.push_back(key_base * 1000003 + b);
  return r;
}

SimOptions Options(int prefill, int decode, int mixed = 0) {
  SimOptions o;
  o.prefill_instances = prefill;
  o.decode_instances = decode;
  o.mixed_instances = mixed;
  o.profile = SmallProfile();
  return o;
}

// One request on an idle 1P+1D cluster: its times are the profile's, exactly.
TEST(Simulate, IdleClusterTimesAreTheProfiles) {
  const SimOptions o = Options(1, 1);
  const std::vector<SimRequest> w = {Request(0, 0.0, 1000, 5, 1)};
  auto res = Simulate(w, o);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  const RequestRecord& r = res->requests[0];
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_FALSE(r.local);
  EXPECT_EQ(r.prefill, "p0");
  EXPECT_EQ(r.decode, "d0");
  const auto& c = o.profile.cost;
  const double prefill = c.PrefillSeconds(1000, 0);
  // The push of 1e6 bytes over 100 MB/s (10 ms) starts with the prefill (1 s), so only its
  // last layer's share (1 ms) follows it, then the link latency.
  const double ttft = prefill + 0.010 / 10 + 1e-4;
  EXPECT_NEAR(r.ttft_s, ttft, 1e-9);
  // Four decode steps of one sequence; the context grows by one token each.
  double e2e = ttft;
  for (int k = 1; k <= 4; ++k) e2e += c.DecodeStepSeconds(1, 1000 + k);
  EXPECT_NEAR(r.e2e_s, e2e, 1e-9);
  EXPECT_NEAR(r.tbt_s, c.DecodeStepSeconds(1, 1004), 1e-6);  // the slowest gap
  EXPECT_NEAR(r.predicted_ttft_s, ttft, 0.01);
  // Nothing is left reserved or queued.
  for (const auto& i : res->instances) EXPECT_EQ(i.kv_overflow_blocks, 0);
}

// Slower engines (neighbours on their cores) stretch every step; the conductor still predicts
// from the profile.
TEST(Simulate, EngineScaleStretchesTheSteps) {
  SimOptions o = Options(1, 1);
  o.engine_scale = 1.5;
  auto res = Simulate({Request(0, 0.0, 1000, 5, 1)}, o);
  ASSERT_TRUE(res.ok());
  const auto& c = o.profile.cost;
  EXPECT_NEAR(res->requests[0].ttft_s, 1.5 * c.PrefillSeconds(1000, 0) + 0.010 / 10 + 1e-4, 1e-9);
  EXPECT_NEAR(res->requests[0].tbt_s, 1.5 * c.DecodeStepSeconds(1, 1004), 1e-6);  // gaps are floats
  EXPECT_NEAR(res->requests[0].predicted_ttft_s, c.PrefillSeconds(1000, 0) + 0.0011, 0.01);
}

// A prompt whose prefix was computed before is served from the prefill instance's cache.
TEST(Simulate, PrefixCacheSavesComputation) {
  const SimOptions o = Options(1, 1);
  const std::vector<SimRequest> w = {Request(0, 0.0, 2000, 2, 7), Request(1, 10.0, 2000, 2, 7)};
  auto res = Simulate(w, o);
  ASSERT_TRUE(res.ok());
  const auto& a = res->requests[0];
  const auto& b = res->requests[1];
  ASSERT_TRUE(a.ok && b.ok);
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_EQ(b.cached_tokens, 1999 / 64 * 64);  // whole blocks, one token left to compute
  EXPECT_LT(b.ttft_s, a.ttft_s / 10);
}

std::vector<SimRequest> Burst(int n, double rate, int input, int output, int groups) {
  std::vector<SimRequest> w;
  for (int i = 0; i < n; ++i) w.push_back(Request(i, i / rate, input, output, 100 + i % groups));
  return w;
}

// Every request ends (completed or a clear failure), and the KV memory is whole at the end.
TEST(Simulate, EveryRequestEndsAndNothingLeaks) {
  SimOptions o = Options(2, 2);
  o.profile.kv_capacity_tokens = 64 * 200;  // tight: requests wait for KV room
  o.deadline_s = 30;
  const auto w = Burst(200, 20.0, 1500, 40, 1000);
  auto res = Simulate(w, o);
  ASSERT_TRUE(res.ok());
  int ok = 0, failed = 0;
  for (const auto& r : res->requests) {
    EXPECT_TRUE(r.ok || r.status == 504 || r.status == 429) << r.index << " " << r.status;
    (r.ok ? ok : failed)++;
  }
  EXPECT_EQ(ok + failed, 200);
  EXPECT_GT(ok, 0);
  EXPECT_GT(res->kv_waits, 0);
  for (const auto& i : res->instances) EXPECT_EQ(i.kv_overflow_blocks, 0) << i.name;
  // Tokens generated: one per request by prefill, the rest by decode steps.
  int64_t decoded = 0, expected = 0;
  for (const auto& i : res->instances) decoded += i.decode_tokens;
  for (const auto& r : res->requests) expected += r.ok ? r.output_tokens - 1 : 0;
  EXPECT_GE(decoded, expected);
}

// The run ends with its last request, not with the timers of requests long served.
TEST(Simulate, DurationEndsWithTheLastRequest) {
  SimOptions o = Options(1, 1);
  o.profile.kv_capacity_tokens = 64 * 60;  // two prompts at a time: the others wait for room
  const auto w = Burst(20, 10.0, 1500, 20, 1000);
  auto res = Simulate(w, o);
  ASSERT_TRUE(res.ok());
  double last = 0;
  for (const auto& r : res->requests) {
    ASSERT_TRUE(r.ok) << r.index;
    last = std::max(last, r.arrival_s + r.e2e_s);
  }
  EXPECT_GT(res->kv_waits, 0);
  EXPECT_NEAR(res->duration_s, last, 1e-9);
}

TEST(Simulate, Deterministic) {
  SimOptions o = Options(2, 2);
  o.engine_noise = 0.2;
  o.placement.policy = PlacementPolicy::kRandom;
  const auto w = Burst(100, 5.0, 800, 30, 10);
  auto a = Simulate(w, o);
  auto b = Simulate(w, o);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(a->requests[i].ttft_s, b->requests[i].ttft_s);
    EXPECT_EQ(a->requests[i].e2e_s, b->requests[i].e2e_s);
    EXPECT_EQ(a->requests[i].prefill, b->requests[i].prefill);
  }
}

// Beyond capacity, early rejection keeps the admitted requests within their SLO; without it
// every request queues and most miss it.
TEST(Simulate, AdmissionRejectsWhatCannotMeetTheSlo) {
  const auto w = Burst(300, 4.0, 1000, 20, 1000);  // prefill alone needs ~4 s per second
  auto attainment = [&](AdmissionPolicy a, int* rejected) {
    SimOptions o = Options(2, 1);
    o.placement.admission = a;
    o.slo_ttft_s = 2.0;
    o.slo_tbt_s = 0.2;
    auto res = Simulate(w, o);
    EXPECT_TRUE(res.ok());
    int met = 0, admitted = 0;
    *rejected = 0;
    for (const auto& r : res->requests) {
      if (r.status == 429) {
        ++*rejected;
        continue;
      }
      ++admitted;
      if (r.ok && r.ttft_s <= o.slo_ttft_s) ++met;
    }
    return admitted ? static_cast<double>(met) / admitted : 0.0;
  };
  int rejected_none = 0, rejected_predictive = 0;
  const double none = attainment(AdmissionPolicy::kNone, &rejected_none);
  const double predictive = attainment(AdmissionPolicy::kPredictive, &rejected_predictive);
  EXPECT_EQ(rejected_none, 0);
  EXPECT_GT(rejected_predictive, 50);
  EXPECT_LT(none, 0.3);
  EXPECT_GT(predictive, 0.9);
}

// With several prefill instances and shared prefixes, the cache-aware policies compute less
// and answer sooner than random placement.
TEST(Simulate, CacheAwarePlacementBeatsRandom) {
  std::vector<SimRequest> w;
  for (int i = 0; i < 160; ++i) w.push_back(Request(i, i * 0.5, 3000, 5, 500 + i % 8));
  auto run = [&](PlacementPolicy p) {
    SimOptions o = Options(4, 2);
    o.placement.policy = p;
    o.profile.prefix_cache_tokens = 64 * 120;  // holds about two of the eight prefixes
    auto res = Simulate(w, o);
    EXPECT_TRUE(res.ok());
    double sum = 0;
    for (const auto& r : res->requests) sum += r.ttft_s;
    return sum / w.size();
  };
  const double random = run(PlacementPolicy::kRandom);
  const double cache_load = run(PlacementPolicy::kCacheLoad);
  EXPECT_LT(cache_load, 0.7 * random) << "random " << random << " cache-load " << cache_load;
}

// A cluster KV pool: prefixes computed on one prefill instance are read on the others (at the
// link's speed), so the hit share rises over per-instance caches that each hold about two of
// eight prefixes; what is read is counted, and the fetch costs time.
TEST(Simulate, TheKvPoolServesPrefixesComputedElsewhere) {
  std::vector<SimRequest> w;
  for (int i = 0; i < 160; ++i) w.push_back(Request(i, i * 0.5, 3000, 5, 500 + i % 8));
  auto run = [&](int64_t pool_tokens, PlacementPolicy p) {
    SimOptions o = Options(4, 2);
    o.placement.policy = p;
    o.profile.prefix_cache_tokens = 64 * 120;
    o.pool_tokens = pool_tokens;
    auto res = Simulate(w, o);
    EXPECT_TRUE(res.ok());
    return std::move(*res);
  };
  auto share = [](const SimResult& r, bool pool_only) {
    int64_t hit = 0, all = 0;
    for (const auto& q : r.requests) {
      hit += pool_only ? q.pool_tokens : q.cached_tokens;
      all += q.input_tokens;
    }
    return static_cast<double>(hit) / static_cast<double>(all);
  };
  const SimResult local = run(0, PlacementPolicy::kLoadBalance);
  const SimResult pool = run(64 * 1000, PlacementPolicy::kLoadBalance);  // holds all eight
  EXPECT_EQ(share(local, true), 0.0);
  EXPECT_GT(share(pool, true), 0.3);
  EXPECT_GT(share(pool, false), 1.5 * share(local, false))
      << "local " << share(local, false) << " pool " << share(pool, false);
  for (const auto& q : pool.requests) EXPECT_LE(q.pool_tokens, q.cached_tokens);
  // A read costs the link: 2,944 tokens x 1,000 B at 100 MB/s = 29 ms, against ~3 s to compute.
  double ttft_local = 0, ttft_pool = 0;
  for (const auto& q : local.requests) ttft_local += q.ttft_s;
  for (const auto& q : pool.requests) ttft_pool += q.ttft_s;
  EXPECT_LT(ttft_pool, ttft_local);
  // The conductor knows what the pool holds: cache-load with the pool is at least as good.
  const SimResult aware = run(64 * 1000, PlacementPolicy::kCacheLoad);
  EXPECT_GE(share(aware, false), share(local, false));
}

// Long prompts computed on a colocated instance stall its decoding streams (chunked prefill
// shares the steps); disaggregated decode keeps its step time.
TEST(Simulate, DisaggregationKeepsTimeBetweenTokens) {
  std::vector<SimRequest> w;
  for (int i = 0; i < 40; ++i) w.push_back(Request(i, i * 1.0, 2000, 60, 900 + i));
  auto p90_tbt = [&](SimOptions o) {
    o.placement.allow_local_prefill = false;
    auto res = Simulate(w, o);
    EXPECT_TRUE(res.ok());
    std::vector<double> tbt;
    for (const auto& r : res->requests) {
      if (r.ok) tbt.push_back(r.tbt_s);
    }
    std::sort(tbt.begin(), tbt.end());
    return tbt[tbt.size() * 9 / 10];
  };
  const double colocated = p90_tbt(Options(0, 0, 2));
  const double disaggregated = p90_tbt(Options(1, 1));
  EXPECT_LT(disaggregated, 0.5 * colocated) << disaggregated << " vs " << colocated;
  EXPECT_LT(disaggregated, 0.05);  // about one decode step of a small batch
}

// A colocated step carrying a prompt chunk is one fused pass: it pays the longer of the
// weights' read (d0 = 20 ms) and the chunk's matmuls (200 tokens: 200 ms), not both.
TEST(Simulate, AChunkAndTheDecodesShareOnePass) {
  SimOptions o = Options(0, 0, 1);
  o.keep_gaps = true;
  const std::vector<SimRequest> w = {Request(0, 0.0, 10, 40, 1), Request(1, 0.2, 200, 2, 2)};
  auto res = Simulate(w, o);
  ASSERT_TRUE(res.ok());
  const auto& gaps = res->requests[0].gaps_s;
  ASSERT_FALSE(gaps.empty());
  const double slowest = *std::max_element(gaps.begin(), gaps.end());
  const auto& c = o.profile.cost;
  // The step with request 1's chunk: per-sequence and context terms of the decode (context of
  // request 0 between 10 and 50 tokens), the chunk's matmuls and its attention.
  const double fused =
      c.decode_per_seq_s + c.prefill_per_token_s * 200 + c.prefill_attention_s * 200 * 100;
  EXPECT_NEAR(slowest, fused + 30e-6, 25e-6);
}

// Conditional disaggregation: a busy prefill instance and an idle decode instance with a
// short prompt: the decode instance computes it itself (unless told not to).
TEST(Simulate, ConditionalDisaggregationComputesLocally) {
  std::vector<SimRequest> w = {Request(0, 0.0, 8000, 2, 1)};
  for (int i = 1; i < 6; ++i) w.push_back(Request(i, 0.1 * i, 100, 2, 10 + i));
  SimOptions o = Options(1, 1);
  auto with = Simulate(w, o);
  o.placement.allow_local_prefill = false;
  auto without = Simulate(w, o);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GT(with->local_prefills, 0);
  EXPECT_EQ(without->local_prefills, 0);
  EXPECT_LT(with->requests[1].ttft_s, without->requests[1].ttft_s);
}

// With --replace-interval-ms, requests held for their prefill turn are placed again while
// they wait (as the conductor does under cache-load); every request still ends, once.
TEST(Simulate, HeldRequestsArePlacedAgain) {
  const auto w = Burst(60, 4.0, 1000, 5, 1000);  // a prefill backlog: requests are held
  SimOptions o = Options(2, 1);
  o.placement.allow_local_prefill = false;
  o.engine_noise = 0.3;  // the queues move off their predictions
  auto once = Simulate(w, o);
  o.replace_interval_s = 0.05;
  auto again = Simulate(w, o);
  ASSERT_TRUE(once.ok() && again.ok());
  EXPECT_EQ(once->placements, 60);
  EXPECT_GT(again->placements, 2 * 60);
  int ok = 0;
  for (const auto& r : again->requests) ok += r.ok;
  EXPECT_EQ(ok, 60);
}

// A conductor that predicts twice the true times rejects requests that would have met the SLO.
TEST(Simulate, OverPredictionRejectsMore) {
  const auto w = Burst(200, 2.0, 1000, 5, 1000);
  SimOptions o = Options(2, 1);
  o.slo_ttft_s = 2.0;
  auto exact = Simulate(w, o);
  o.predicted_scale = 2.0;
  auto pessimistic = Simulate(w, o);
  ASSERT_TRUE(exact.ok() && pessimistic.ok());
  auto rejected = [](const SimResult& r) {
    int n = 0;
    for (const auto& q : r.requests) n += q.status == 429;
    return n;
  };
  EXPECT_GT(rejected(*pessimistic), rejected(*exact) + 20);
}

// A prompt-heavy load on 1P+3D: prefill needs ~2.5 instances (1 s prompts every 0.4 s), decode
// almost none. The planner gives decode instances to prefill (never the last one); each one
// drains first; SLO attainment rises far above the static split's, and every request still ends.
TEST(Simulate, ElasticPlannerMovesIdleDecodeInstancesToPrefill) {
  std::vector<SimRequest> load;
  for (int i = 0; i < 150; ++i) load.push_back(Request(i, 0.4 * i, 1000, 4, 100 + i));
  SimOptions o = Options(1, 3);
  o.slo_ttft_s = 5.0;
  o.slo_tbt_s = 0.1;
  o.placement.admission = AdmissionPolicy::kNone;
  o.placement.allow_local_prefill = false;  // prompts only on prefill instances
  auto fixed = Simulate(load, o);
  o.elastic = true;
  o.planner.dwell_s = 4;
  auto elastic = Simulate(load, o);
  ASSERT_TRUE(fixed.ok() && elastic.ok());
  auto attainment = [](const SimResult& r) {
    int met = 0;
    for (const auto& q : r.requests) met += q.ok && q.ttft_s <= 5.0;
    return static_cast<double>(met) / r.requests.size();
  };
  EXPECT_LT(attainment(*fixed), 0.3);
  EXPECT_GT(attainment(*elastic), 0.8);
  for (const auto& q : elastic->requests) EXPECT_TRUE(q.ok) << q.index << " " << q.error;
  EXPECT_EQ(fixed->role_switches, 0);
  EXPECT_EQ(elastic->role_switches, 2);  // two decode instances to prefill; the last one stays
  int to_prefill = 0, decode_left = 0;
  for (const auto& inst : elastic->instances) {
    for (const auto& [t, role] : inst.role_changes) {
      EXPECT_GT(t, 0.0);
      to_prefill += role == conductor::WorkerRole::kPrefill;
    }
    decode_left += inst.role == conductor::WorkerRole::kDecode;
  }
  EXPECT_EQ(to_prefill, 2);
  EXPECT_EQ(decode_left, 1);
  EXPECT_GE(elastic->planner_decisions["to_prefill/prefill_load"], 2);
  // Deterministic, like every simulation.
  auto again = Simulate(load, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->role_switches, elastic->role_switches);
  EXPECT_EQ(again->events, elastic->events);
}

TEST(Workload, PhasesFollowEachOtherAndShareNothing) {
  SyntheticOptions base;
  base.block_tokens = 64;
  base.range = 0;
  auto phases = ParsePhases("n=5,in=640,out=2,rate=10;n=3,in=64,out=50,rate=1", base);
  ASSERT_TRUE(phases.ok()) << phases.status().ToString();
  ASSERT_EQ(phases->size(), 2u);
  EXPECT_EQ((*phases)[1].requests, 3);
  EXPECT_EQ((*phases)[1].output_tokens, 50);
  EXPECT_DOUBLE_EQ((*phases)[0].rate, 10);
  const std::vector<SimRequest> load = Phased(*phases);
  ASSERT_EQ(load.size(), 8u);
  for (size_t i = 0; i < load.size(); ++i) {
    EXPECT_EQ(load[i].index, static_cast<int>(i));
    if (i > 0) {
      EXPECT_GT(load[i].arrival_s, load[i - 1].arrival_s);
    }
    EXPECT_EQ(load[i].input_tokens, i < 5 ? 640 : 64);
  }
  // Unique prompts: no key of one request appears in another's.
  std::set<uint64_t> keys;
  size_t n_keys = 0;
  for (const auto& r : load) {
    keys.insert(r.keys.begin(), r.keys.end());
    n_keys += r.keys.size();
  }
  EXPECT_EQ(keys.size(), n_keys);
  for (const char* bad : {"", "n=5,in=x", "n=5,depth=3", "n=-1", "n=5,in"}) {
    EXPECT_FALSE(ParsePhases(bad, base).ok()) << bad;
  }
}

TEST(Simulate, BadOptionsAreClearErrors) {
  const std::vector<SimRequest> w = {Request(0, 0.0, 100, 2, 1)};
  EXPECT_EQ(Simulate(w, Options(1, 0)).status().code(), StatusCode::kInvalidArgument);
  SimOptions o = Options(1, 1);
  o.profile.kv_capacity_tokens = 0;
  EXPECT_EQ(Simulate(w, o).status().code(), StatusCode::kInvalidArgument);
  const std::vector<SimRequest> unordered = {Request(0, 1.0, 100, 2, 1),
                                             Request(1, 0.0, 100, 2, 2)};
  EXPECT_EQ(Simulate(unordered, Options(1, 1)).status().code(), StatusCode::kInvalidArgument);
}

// The summary follows the benchmark's definitions (servebench/metrics.py).
TEST(Report, SummaryCountsAndPercentiles) {
  SimResult res;
  for (int i = 0; i < 5; ++i) {
    RequestRecord r;
    r.index = i;
    r.ok = i < 4;
    r.status = r.ok ? 200 : 429;
    r.input_tokens = 100;
    r.output_tokens = 10;
    r.ttft_s = 0.1 * (i + 1);  // 100..400 ms for the completed ones
    r.e2e_s = 1.0;
    r.tbt_s = 0.05;
    r.tpot_s = 0.05;
    res.requests.push_back(r);
  }
  res.duration_s = 10;
  const auto s = nlohmann::json::parse(SummaryJson(res, 0.25, 0.1));
  EXPECT_EQ(s["completed"], 4);
  EXPECT_EQ(s["rejected"], 1);
  EXPECT_DOUBLE_EQ(s["ttft_ms"]["p50"].get<double>(), 250.0);  // between 200 and 300
  EXPECT_NEAR(s["ttft_ms"]["p90"].get<double>(), 370.0, 1e-9);
  EXPECT_EQ(s["met_all_slos"], 2);                           // TTFT 100 and 200 ms
  EXPECT_DOUBLE_EQ(s["slo_attainment"].get<double>(), 0.4);  // the rejected one is a miss
  EXPECT_DOUBLE_EQ(s["goodput_rps"].get<double>(), 0.2);
}

}  // namespace
}  // namespace tandem::sim
