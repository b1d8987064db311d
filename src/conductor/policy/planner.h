// The planner of elastic pools: which worker, if any, should change role (prefill <-> decode)
// now, decided from the load the conductor measures and predicts. A pure function like the
// placement policy: the conductor calls it every interval with a snapshot and carries out the
// decision; tests (and the simulator) call it with made-up snapshots.
//
// Loads, each a share of what the pool can take while meeting the SLOs (1.0: at the limit):
//   prefill load = max(predicted prefill work queued in the cluster (on every worker and held
//                      by the conductor) / (prefill workers x TTFT SLO),
//                      mean measured busy share of the prefill workers)
//   decode load  = mean over decode-capable workers of
//                      max(predicted step time of its batch / TBT SLO, share of its KV in use,
//                          sequences placed there / its batch's places)
// and a pool whose SLO made admission turn requests away (PlannerInput's rejected shares) is
// above `high` whatever those figures say: admission keeps the predictions within the SLOs by
// refusing the excess, so the excess shows only as rejections.
// (with no SLO, the defaults of PlannerOptions stand in). A worker moves from the pool below
// `low` to the pool above `high` when the giving pool's load, spread over one worker fewer,
// stays below `high` — hysteresis: the band between low and high is left alone. A worker that
// changed role less than `dwell_s` ago does not change again, and the cluster makes at most one
// change per `dwell_s` / 2, so the pools do not oscillate. A decode worker given to prefill is
// the one holding the fewest streams (it finishes them; none is drained or cut).
#pragma once

#include <string>
#include <vector>

#include "conductor/policy/placement.h"

namespace tandem::conductor {

struct PlannerWorker {
  std::string name;
  WorkerRole role = WorkerRole::kMixed;
  bool healthy = false;
  double since_switch_s = 1e9;  // since it last changed role (or joined)
  double prefill_queue_s = 0;   // predicted prefill work placed there, not done
  int decoding = 0;             // sequences in its decode batch
  double decode_step_s = 0;     // predicted step time of that batch (0: none)
  double kv_used = 0;           // share of its KV blocks held by sequences, 0..1
  double seq_used = 0;          // sequences placed there (decoding or about to) / its
                                // max_num_seqs: above 1, some wait for a place in the batch
  double busy_share = 0;        // share of recent wall time its engine computed, 0..1
  double idle_s = 1e9;          // since its engine last computed (or it joined or changed role)
};

struct PlannerInput {
  std::vector<PlannerWorker> workers;
  double held_prefill_s = 0;         // predicted prefill work of requests the conductor still holds
  double slo_ttft_s = 0;             // 0: none (PlannerOptions::ttft_scale_s stands in)
  double slo_tbt_s = 0;              // 0: none (PlannerOptions::tbt_scale_s stands in)
  double since_last_switch_s = 1e9;  // since any worker last changed role
  // Of the requests that arrived since the last decision, the shares admission refused for
  // their TTFT SLO ("ttft_slo") and for their TBT SLO or KV room ("tbt_slo", "kv_full"): load
  // that the predictions above no longer show, because it was turned away.
  double ttft_rejected_share = 0;
  double tbt_rejected_share = 0;
};

struct PlannerOptions {
  double high = 0.7;    // a pool above this load asks for a worker
  double low = 0.35;    // a pool gives one only while below this
  double dwell_s = 10;  // a worker keeps a new role at least this long
  int min_decode = 1;   // decode-capable workers kept (the cluster cannot serve without one)
  int min_prefill = 0;  // prefill workers kept (decode workers can compute prompts themselves)
  // Whether kRemove may offer the last prefill worker (with min_prefill 0). On one host with a
  // core budget its cores go to the decode workers (the thread planner), which compute prompts
  // themselves until the load asks for a prefill worker again (kAdd). Off: the last one stays.
  bool remove_last_prefill = false;
  // kRemove offers only a prefill worker whose engine has computed nothing for this long: a
  // snapshot of both pools below `low` is common between the prompts of a bursty load, and a
  // worker stopped there is started again at the next burst (which pays the start).
  double remove_idle_s = 30;
  double ttft_scale_s = 2.0;  // stands in for a missing TTFT SLO
  double tbt_scale_s = 0.1;   // stands in for a missing TBT SLO
  // A pool whose SLO turned away at least this share of the arrivals is loaded above `high`
  // (its load is taken as high + that share).
  double rejected_share = 0.02;
};

struct PlannerDecision {
  enum class Action { kNone, kToPrefill, kToDecode };
  Action action = Action::kNone;
  int worker = -1;  // index into PlannerInput::workers (kToPrefill / kToDecode)
  // Why, as a short label for metrics: "prefill_load" / "decode_load" (a move), or for no move
  // "balanced", "dwell", "min_pool" (the pool that would give is at its minimum size),
  // "no_candidate" (its workers changed role within the dwell time, or are unhealthy),
  // "both_loaded" (the giving pool is not below low, or would go above high with one fewer).
  std::string reason;
  std::string detail;  // a sentence with the figures, for the log
  double prefill_load = 0, decode_load = 0;
  int prefill_workers = 0, decode_workers = 0;  // pool sizes once the decision is carried out
  // What moving roles cannot give, for an orchestrator that adds or removes machines:
  //   kAdd     one more worker of `scale_role`: its pool is above high and the other pool
  //            cannot spare one ("both_loaded", "min_pool"; with both above high, the pool
  //            with the higher load);
  //   kRemove  prefill worker `scale_worker` could go: both pools below low, it has held
  //            its role for the dwell time, holds no queued prefill and has been idle for
  //            remove_idle_s, and the prefill pool keeps its minimum (and at least one worker
  //            unless remove_last_prefill) and stays below high without it (the decode pool
  //            computing its prompts if none).
  //            The decode pool stays resident (it holds the streams; roles move it).
  enum class Scale { kNone, kAdd, kRemove };
  Scale scale = Scale::kNone;
  WorkerRole scale_role = WorkerRole::kPrefill;
  int scale_worker = -1;  // kRemove: index into PlannerInput::workers
};

// "none", "add_prefill", "add_decode", "remove".
std::string PlannerScaleName(const PlannerDecision& d);

const char* PlannerActionName(PlannerDecision::Action a);  // "none", "to_prefill", "to_decode"

PlannerDecision PlanPools(const PlannerInput& in, const PlannerOptions& options);

}  // namespace tandem::conductor
