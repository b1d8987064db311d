#include "conductor/policy/planner.h"

#include <gtest/gtest.h>

namespace tandem::conductor {
namespace {

using Action = PlannerDecision::Action;

PlannerWorker Prefill(const std::string& name, double queue_s, double busy) {
  PlannerWorker w;
  w.name = name;
  w.role = WorkerRole::kPrefill;
  w.healthy = true;
  w.prefill_queue_s = queue_s;
  w.busy_share = busy;
  return w;
}

PlannerWorker Decode(const std::string& name, int decoding, double step_s, double kv_used) {
  PlannerWorker w;
  w.name = name;
  w.role = WorkerRole::kDecode;
  w.healthy = true;
  w.decoding = decoding;
  w.decode_step_s = step_s;
  w.kv_used = kv_used;
  return w;
}

// TTFT SLO 2 s, TBT SLO 100 ms: the loads below are simple fractions of them.
PlannerInput Cluster(std::vector<PlannerWorker> workers) {
  PlannerInput in;
  in.workers = std::move(workers);
  in.slo_ttft_s = 2.0;
  in.slo_tbt_s = 0.1;
  return in;
}

TEST(PlannerTest, LoadsAreSharesOfTheSlos) {
  // Prefill: 3 s queued + 1 s held over 2 workers x 2 s = 1.0 (the busy shares are lower).
  // Decode: mean of max(0.05 / 0.1, 0.2) = 0.5 and max(0.02 / 0.1, 0.6) = 0.6 -> 0.55.
  PlannerInput in = Cluster({Prefill("p0", 2.0, 0.5), Prefill("p1", 1.0, 0.9),
                             Decode("d0", 4, 0.05, 0.2), Decode("d1", 1, 0.02, 0.6)});
  in.held_prefill_s = 1.0;
  const PlannerDecision d = PlanPools(in, {});
  EXPECT_DOUBLE_EQ(d.prefill_load, 1.0);
  EXPECT_DOUBLE_EQ(d.decode_load, 0.55);
  EXPECT_EQ(d.action, Action::kNone);  // decode is not below `low`: it cannot give
  EXPECT_EQ(d.reason, "both_loaded");
  EXPECT_EQ(d.prefill_workers, 2);
  EXPECT_EQ(d.decode_workers, 2);

  // A decode worker with more sequences placed than its batch holds is loaded (they wait).
  PlannerWorker full = Decode("d9", 40, 0.01, 0.1);
  full.seq_used = 1.25;
  EXPECT_DOUBLE_EQ(PlanPools(Cluster({full}), {}).decode_load, 1.25);
  // A saturated prefill worker counts as loaded even with a short queue.
  const PlannerDecision busy = PlanPools(Cluster({Prefill("p0", 0.1, 0.95)}), {});
  EXPECT_DOUBLE_EQ(busy.prefill_load, 0.95);
  // No SLO: the options' scales stand in (2 s queued / 2 s).
  PlannerInput no_slo = Cluster({Prefill("p0", 2.0, 0.0), Decode("d0", 1, 0.05, 0)});
  no_slo.slo_ttft_s = no_slo.slo_tbt_s = 0;
  PlannerOptions o;
  o.ttft_scale_s = 4.0;
  o.tbt_scale_s = 0.5;
  const PlannerDecision scaled = PlanPools(no_slo, o);
  EXPECT_DOUBLE_EQ(scaled.prefill_load, 0.5);
  EXPECT_DOUBLE_EQ(scaled.decode_load, 0.1);
}

TEST(PlannerTest, IdleDecodeWorkerMovesToALoadedPrefillPool) {
  // Decode load 0.1 over 3 workers (0.15 over 2): d1, which holds no stream, goes to prefill.
  const PlannerInput in = Cluster({Prefill("p0", 3.0, 1.0), Decode("d0", 2, 0.01, 0.1),
                                   Decode("d1", 0, 0.0, 0.0), Decode("d2", 3, 0.01, 0.2)});
  const PlannerDecision d = PlanPools(in, {});
  EXPECT_EQ(d.action, Action::kToPrefill);
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, "prefill_load");
  EXPECT_EQ(d.prefill_workers, 2);
  EXPECT_EQ(d.decode_workers, 2);
  EXPECT_NE(d.detail.find("d1"), std::string::npos);
}

TEST(PlannerTest, PrefillWorkerMovesToALoadedDecodePool) {
  // Decode at 0.9 of its TBT SLO; prefill idle. The prefill worker with the shorter queue goes.
  const PlannerInput in =
      Cluster({Prefill("p0", 0.2, 0.1), Prefill("p1", 0.0, 0.05), Decode("d0", 30, 0.09, 0.5)});
  const PlannerDecision d = PlanPools(in, {});
  EXPECT_EQ(d.action, Action::kToDecode);
  EXPECT_EQ(d.worker, 1);
  EXPECT_EQ(d.reason, "decode_load");
  EXPECT_EQ(d.prefill_workers, 1);
  EXPECT_EQ(d.decode_workers, 2);
  // The last prefill worker may go too: the decode workers then compute the prompts.
  const PlannerDecision last =
      PlanPools(Cluster({Prefill("p0", 0.0, 0.05), Decode("d0", 30, 0.09, 0.5)}), {});
  EXPECT_EQ(last.action, Action::kToDecode);
  EXPECT_EQ(last.prefill_workers, 0);
}

TEST(PlannerTest, HysteresisDwellAndMinimumsHoldThePools) {
  PlannerOptions o;
  // Between low and high nothing moves, whichever way the load leans.
  EXPECT_EQ(
      PlanPools(
          Cluster({Prefill("p0", 1.2, 0.6), Decode("d0", 1, 0.04, 0), Decode("d1", 1, 0.04, 0)}), o)
          .reason,
      "balanced");
  // Both above high: no pool can give.
  EXPECT_EQ(
      PlanPools(
          Cluster({Prefill("p0", 4.0, 1.0), Decode("d0", 8, 0.09, 0), Decode("d1", 8, 0.09, 0)}), o)
          .reason,
      "both_loaded");
  // A move that would push the giving pool above high is refused: decode 0.4 over 2 -> 0.8.
  EXPECT_EQ(PlanPools(Cluster({Prefill("p0", 4.0, 1.0), Decode("d0", 1, 0.04, 0),
                               Decode("d1", 1, 0.04, 0)}),
                      PlannerOptions{.low = 0.5})
                .reason,
            "both_loaded");
  // The only decode worker never leaves.
  const PlannerInput one_decode = Cluster({Prefill("p0", 4.0, 1.0), Decode("d0", 0, 0, 0)});
  EXPECT_EQ(PlanPools(one_decode, o).reason, "min_pool");
  // Too soon after the last change anywhere, or for the only candidate itself.
  PlannerInput loaded =
      Cluster({Prefill("p0", 4.0, 1.0), Decode("d0", 0, 0, 0), Decode("d1", 0, 0, 0)});
  loaded.since_last_switch_s = o.dwell_s / 2 - 0.1;
  EXPECT_EQ(PlanPools(loaded, o).reason, "dwell");
  loaded.since_last_switch_s = o.dwell_s;
  loaded.workers[1].since_switch_s = 1.0;
  EXPECT_EQ(PlanPools(loaded, o).worker, 2);
  loaded.workers[2].since_switch_s = 1.0;
  EXPECT_EQ(PlanPools(loaded, o).reason, "no_candidate");
  // Unhealthy workers count for nothing.
  loaded.workers[1].since_switch_s = loaded.workers[2].since_switch_s = 1e9;
  loaded.workers[1].healthy = false;
  EXPECT_EQ(PlanPools(loaded, o).reason, "min_pool");
}

TEST(PlannerTest, RejectionsShowLoadThePredictionsHide) {
  // Admission keeps the decode batch within its SLO (load 0.3) by refusing 10% of the
  // arrivals for their TBT: the decode pool is loaded, and the idle prefill worker goes.
  PlannerInput in = Cluster({Prefill("p0", 0.0, 0.05), Decode("d0", 8, 0.03, 0.2)});
  EXPECT_EQ(PlanPools(in, {}).reason, "balanced");
  in.tbt_rejected_share = 0.1;
  const PlannerDecision d = PlanPools(in, {});
  EXPECT_DOUBLE_EQ(d.decode_load, 0.8);
  EXPECT_EQ(d.action, Action::kToDecode);
  // A share under the threshold is noise.
  in.tbt_rejected_share = 0.01;
  EXPECT_EQ(PlanPools(in, {}).action, Action::kNone);
  // TTFT rejections load the prefill pool the same way.
  PlannerInput p = Cluster({Prefill("p0", 0.2, 0.3), Decode("d0", 0, 0, 0), Decode("d1", 0, 0, 0)});
  p.ttft_rejected_share = 0.25;
  const PlannerDecision q = PlanPools(p, {});
  EXPECT_DOUBLE_EQ(q.prefill_load, 0.95);
  EXPECT_EQ(q.action, Action::kToPrefill);
}

TEST(PlannerTest, MixedWorkersDecodeButAreNotMoved) {
  PlannerWorker m = Decode("m0", 0, 0, 0);
  m.role = WorkerRole::kMixed;
  const PlannerDecision d =
      PlanPools(Cluster({Prefill("p0", 4.0, 1.0), m, Decode("d0", 0, 0, 0)}), {});
  EXPECT_EQ(d.decode_workers, 1);  // after the move: m0 stays
  EXPECT_EQ(d.action, Action::kToPrefill);
  EXPECT_EQ(d.worker, 2);
}

using Scale = PlannerDecision::Scale;

// What role moves cannot give: a pool above high whose partner cannot spare a worker asks an
// orchestrator for one more worker of its role.
TEST(PlannerTest, BothPoolsLoadedAskForAnotherWorker) {
  // Prefill load 1.5 (6 s queued over 2 workers x 2 s), decode load 0.8: both above high.
  auto d = PlanPools(
      Cluster({Prefill("p0", 3, 0.9), Prefill("p1", 3, 0.9), Decode("d0", 8, 0.08, 0.5)}), {});
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_EQ(d.reason, "both_loaded");
  EXPECT_EQ(d.scale, Scale::kAdd);
  EXPECT_EQ(d.scale_role, WorkerRole::kPrefill);
  EXPECT_EQ(PlannerScaleName(d), "add_prefill");
  // The decode pool at its minimum (one worker) cannot give one to a loaded prefill pool; a
  // loaded decode pool whose prefill partner is busy asks for a decode worker.
  d = PlanPools(Cluster({Prefill("p0", 0, 0.9), Decode("d0", 8, 0.2, 0.9)}), {});
  EXPECT_EQ(d.scale, Scale::kAdd);
  EXPECT_EQ(d.scale_role, WorkerRole::kDecode);
  EXPECT_EQ(PlannerScaleName(d), "add_decode");
  // Balanced pools ask for nothing.
  d = PlanPools(Cluster({Prefill("p0", 1, 0.5), Decode("d0", 4, 0.05, 0.5)}), {});
  EXPECT_EQ(d.reason, "balanced");
  EXPECT_EQ(d.scale, Scale::kNone);
}

// Both pools idle: an idle prefill worker may leave (the prefill pool shrinks with demand), never
// the last one, nor one with queued work or that changed role within the dwell time; the
// decode pool stays resident.
TEST(PlannerTest, IdlePoolsOfferAnIdlePrefillWorker) {
  // Two decode workers (one idle) and one prefill worker: nothing goes.
  auto d = PlanPools(
      Cluster({Prefill("p0", 0, 0.1), Decode("d0", 2, 0.02, 0.1), Decode("d1", 0, 0, 0)}), {});
  EXPECT_EQ(d.reason, "balanced");
  EXPECT_EQ(d.scale, Scale::kNone);
  // Two prefill workers: the idle one goes (p0 has queued work).
  d = PlanPools(
      Cluster({Prefill("p0", 0.1, 0.1), Prefill("p1", 0, 0.0), Decode("d0", 2, 0.02, 0.2)}), {});
  EXPECT_EQ(d.scale, Scale::kRemove);
  EXPECT_EQ(d.scale_worker, 1);
  EXPECT_EQ(PlannerScaleName(d), "remove");
  // One that just changed role stays.
  PlannerWorker fresh = Prefill("p1", 0, 0.0);
  fresh.since_switch_s = 1;
  d = PlanPools(Cluster({Prefill("p0", 0.1, 0.1), fresh, Decode("d0", 2, 0.02, 0.2)}), {});
  EXPECT_EQ(d.scale, Scale::kNone);
  // So does one that computed a prompt within remove_idle_s, though its queue is empty and both
  // pools are below low now (a pause between the bursts of a bursty load); it goes once it has
  // been idle that long.
  PlannerWorker paused = Prefill("p1", 0, 0.0);
  paused.idle_s = 5;
  const PlannerInput between_bursts =
      Cluster({Prefill("p0", 0.1, 0.1), paused, Decode("d0", 2, 0.02, 0.2)});
  EXPECT_EQ(PlanPools(between_bursts, {.remove_idle_s = 30}).scale, Scale::kNone);
  d = PlanPools(between_bursts, {.remove_idle_s = 5});
  EXPECT_EQ(d.scale, Scale::kRemove);
  EXPECT_EQ(d.scale_worker, 1);
  // With remove_last_prefill (one host, a core budget), the last idle prefill worker may go:
  // the decode worker then computes prompts on its cores too.
  const PlannerInput quiet = Cluster({Prefill("p0", 0, 0.0), Decode("d0", 2, 0.02, 0.2)});
  EXPECT_EQ(PlanPools(quiet, {}).scale, Scale::kNone);
  d = PlanPools(quiet, {.remove_last_prefill = true});
  EXPECT_EQ(d.scale, Scale::kRemove);
  EXPECT_EQ(d.scale_worker, 0);
  // With no prefill worker left, a loaded prefill pool asks for a prefill worker even when the
  // decode pool is more loaded (the decode workers compute the prompts: it relieves both).
  PlannerWorker busy_decode = Decode("d0", 8, 0.2, 0.5);
  busy_decode.prefill_queue_s = 3;  // local prefills queued there
  d = PlanPools(Cluster({busy_decode}), {.remove_last_prefill = true});
  EXPECT_EQ(d.scale, Scale::kAdd);
  EXPECT_EQ(d.scale_role, WorkerRole::kPrefill);
  // ... not while it is busy, nor when its load would put the decode pool above high.
  EXPECT_EQ(PlanPools(Cluster({Prefill("p0", 0.5, 0.3), Decode("d0", 2, 0.02, 0.2)}),
                      {.remove_last_prefill = true})
                .scale,
            Scale::kNone);
}

}  // namespace
}  // namespace tandem::conductor
