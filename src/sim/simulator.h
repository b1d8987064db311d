// A discrete-event simulation of a tandem cluster: prefill, decode and mixed instances whose
// engines take the time their profile says, fed by a workload, and scheduled by the
// conductor's own code — the placement and admission policy (conductor/policy/placement.h)
// over the conductor's own bookkeeping (conductor/cluster_view.h), with the request flow of
// the conductor (conductor_request.cc: late KV reservation at the prefill's turn, waiting for
// KV room, conditional disaggregation, online correction of the cost models). Only the engines, the
// transfer and the clock are simulated.
//
// What the simulated engines do:
//   - prefill instance: one prompt at a time in arrival order; its prefix cache (LRU over
//     block keys, `prefix_cache_tokens` of host memory) saves the cached part; with a cluster
//     KV pool (`pool_tokens`, Mooncake Store: one LRU over every block any prefill instance
//     computed), it reads what the pool holds beyond its own cache over its link before it
//     computes the rest, and offers what it computed; the KV goes to
//     the decode instance layer by layer over the instance's link (serialised per prefill
//     instance), so only the last layer's share, or what the link cannot hide, follows the
//     prefill; the first token is returned when the push is done (as the real worker does).
//   - decode / mixed instance: continuous batching; one step decodes every sequence in the
//     batch and, when prompts are computed there (local prefill, or a mixed instance), carries
//     up to max_batch_tokens − batch of their tokens (chunked prefill; the step is one fused
//     pass, so it costs the longer of the weights' read d0 and the chunks' matmuls, plus the
//     per-sequence, context and attention terms); it answers a KV
//     reservation between two steps (as the worker's loop does); its KV memory holds the
//     running sequences (blocks grown as they decode) and, in what is free, the prompts of
//     finished ones for reuse (LRU).
// The conductor's view of each instance is exact and immediate (no heartbeat delay); its cost
// models are the engines' true ones (times `predicted_scale`), while the engines' step times
// may carry noise. The profile's ttft_overhead_s delays each first token's delivery and its
// step_overhead_s lengthens every decode step (what an engine's step times leave out). Block
// growth beyond the KV memory is counted (kv_overflow_blocks), not
// preempted.
//
// Deterministic: the same workload and options give the same result.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "conductor/policy/placement.h"
#include "conductor/policy/planner.h"
#include "sim/profile.h"
#include "sim/workload.h"

namespace tandem::sim {

struct SimOptions {
  int prefill_instances = 1;
  int decode_instances = 1;
  int mixed_instances = 0;                // colocated instances (prefill and decode on one engine)
  InstanceProfile profile;                // every instance alike
  conductor::PlacementOptions placement;  // policy, admission, local prefill
  double slo_ttft_s = 0;                  // 0: none
  double slo_tbt_s = 0;                   // 0: none
  double deadline_s = 600;                // per request, from its arrival
  double replace_interval_s = 0;          // > 0: a held request is placed again this often
  double engine_noise = 0;                // sigma of a log-normal factor on every step time
  double predicted_scale = 1.0;           // the conductor's cost models = the profile's x this
  double engine_scale = 1.0;              // the engines' true step times = the profile's x this (an
                                          // engine slowed by neighbours on its cores)
  double utilisation_interval_s = 10;
  bool keep_gaps = false;  // keep every request's token gaps in its record
  // Elastic pools: every planner_interval_s the conductor's planner (policy/planner.h) may
  // switch one prefill or decode instance to the other role. A switching instance takes no new
  // work, finishes what it holds (drains), then serves in its new role.
  bool elastic = false;
  conductor::PlannerOptions planner;
  double planner_interval_s = 1.0;
  // The cluster KV pool: tokens of KV it holds (0: none). The conductor is told how much of
  // each prompt it holds (as its PoolDirectory would be), and prefill instances use it.
  int64_t pool_tokens = 0;
  uint64_t seed = 1;
};

struct RequestRecord {
  int index = 0;
  double arrival_s = 0;
  int input_tokens = 0;
  int requested_output_tokens = 0;
  int output_tokens = 0;  // generated (the first included)
  bool ok = false;
  int status = 0;     // 200, 429 (rejected), 503 (no worker), 504 (deadline)
  std::string error;  // reason code when not ok
  double ttft_s = 0, e2e_s = 0;
  double tbt_s = -1;   // mean of the slowest 10% of gaps; -1 without gaps
  double tpot_s = -1;  // (e2e - ttft) / (output - 1); -1 for one token
  double mean_gap_s = 0;
  int cached_tokens = 0;        // prompt tokens its prefill did not compute
  int pool_tokens = 0;          // ... of which read from the cluster KV pool
  std::string prefill, decode;  // instance names (prefill empty: local)
  bool local = false;
  bool waited_for_kv = false;
  double predicted_ttft_s = 0, predicted_tbt_s = 0;
  // What its TTFT is made of (seconds): waiting for decode KV room before its last placement,
  // held by the conductor until its prefill turn, queued on the prefill instance, computing,
  // and the KV transfer's tail.
  double kv_wait_s = 0, hold_s = 0, queue_s = 0, prefill_s = 0, transfer_s = 0;
  std::vector<float> gaps_s;  // with keep_gaps
};

struct InstanceRecord {
  std::string name;
  conductor::WorkerRole role = conductor::WorkerRole::kMixed;  // at the end (elastic: see
                                                               // role_changes)
  double busy_s = 0;                                           // engine computing
  std::vector<double> busy_share;  // per utilisation interval, in [0, 1]
  int64_t prefill_tokens = 0;      // prompt tokens computed
  int64_t cached_tokens = 0;       // prompt tokens served from its prefix cache or the pool
  int64_t pool_tokens = 0;         // ... of which read from the cluster KV pool
  int64_t decode_tokens = 0;       // tokens generated by its decode steps
  int64_t steps = 0;
  int64_t kv_overflow_blocks = 0;  // block growth the KV memory could not hold
  // Elastic pools: (seconds since the first arrival, the role it took) at each switch done.
  std::vector<std::pair<double, conductor::WorkerRole>> role_changes;
};

struct SimResult {
  std::vector<RequestRecord> requests;  // by index
  std::vector<InstanceRecord> instances;
  std::vector<float> gaps_s;  // every token gap, pooled (for ITL statistics)
  double duration_s = 0;      // first arrival to the last event
  double utilisation_interval_s = 0;
  int64_t events = 0;
  int64_t placements = 0;  // calls of the policy
  int64_t kv_waits = 0;    // requests that waited for KV room
  int64_t local_prefills = 0;
  // Elastic pools: the planner's decisions by "action/reason", and the role switches done.
  std::map<std::string, int64_t> planner_decisions;
  int64_t role_switches = 0;
  double wall_s = 0;  // host time the simulation took
};

StatusOr<SimResult> Simulate(const std::vector<SimRequest>& workload, const SimOptions& options);

}  // namespace tandem::sim
