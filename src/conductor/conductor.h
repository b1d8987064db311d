// The conductor of disaggregated serving: a serving::GenerationBackend (so the OpenAI front
// door of src/server is unchanged) that places each request on a prefill and a decode worker
// found in the metadata service, by the policy of policy/placement.h, drives the hand-off and
// relays the tokens.
//
// Request flow (cluster/protocol.h): the decode worker reserves the KV blocks its prefix cache
// lacks and says where they are ("reserved"); the prefill worker computes the prompt, writes
// its KV into those blocks layer by layer and answers with the first token, which goes to the
// client at once; the decode worker, notified by the transfer engine, continues and streams the
// rest. With `local` placement (conditional disaggregation) the decode worker computes the
// prompt itself.
//
// Admission: Submit rejects (ResourceExhausted, HTTP 429 with Retry-After) a request whose
// predicted TTFT or TBT breaks its SLO, before any work is spent; no decode worker at all is
// Unavailable (503). A request admitted while no decode worker has KV room waits for room (up
// to its deadline) instead of failing; so does one whose reservation a worker refused.
//
// Failures: a prefill worker that fails is replaced by another (the reservation is kept); with
// none left the decode worker computes the prompt itself (counted as a fallback). A decode
// worker that fails ends its requests with an error. Each request's deadline goes to every
// worker; nothing waits past it.
//
// Threading: one thread per request in flight (it mostly waits on sockets), owned by the
// conductor and joined when it ends or at destruction; one heartbeat thread that refreshes
// membership and load every `heartbeat`. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "conductor/policy/pipeline.h"
#include "conductor/policy/placement.h"
#include "conductor/policy/planner.h"
#include "conductor/policy/thread_planner.h"
#include "serving/backend.h"
#include "transfer/metadata.h"

namespace tandem::conductor {

using Clock = std::chrono::steady_clock;

struct ConductorOptions {
  std::shared_ptr<transfer::MetadataStore> metadata;  // where workers publish themselves
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds worker_timeout{2000};  // silent this long: unhealthy
  int max_inflight = 1024;                         // beyond: ResourceExhausted (429)
  int vocab_size = 0;                              // > 0: token ids are checked at Submit
  int max_model_len = 0;                           // > 0: prompt + max_tokens are checked
  PlacementPolicy placement = PlacementPolicy::kCacheLoad;
  AdmissionPolicy admission = AdmissionPolicy::kPredictive;
  bool local_prefill = true;  // conditional disaggregation
  // Server-wide SLOs (seconds; 0: none); a request's own SLO fields take precedence.
  double slo_ttft_s = 0;
  double slo_tbt_s = 0;
  uint64_t random_seed = 1;  // PlacementPolicy::kRandom
  // Chunked pipeline-parallel prefill: a prompt with at least pipeline.min_tokens tokens that
  // its decode worker lacks is prefilled by up to max_stages prefill workers at once (the one
  // placement chose first, then the least loaded), its layers split by policy/pipeline.h.
  // Requests with structured output or prompt logprobs are not pipelined.
  PipelineOptions pipeline;
  // Elastic pools: every planner_interval the planner (policy/planner.h) looks at the load and
  // may switch one worker between prefill and decode (POST /v1/role).
  bool elastic = false;
  PlannerOptions planner;
  std::chrono::milliseconds planner_interval{1000};
  // Elastic pools on one host: the cores the workers' engine threads may add up to. With
  // `elastic`, every planner interval PlanThreads (policy/thread_planner.h) divides them
  // between the workers that say their max_threads (POST /v1/threads). 0: threads not planned.
  int core_budget = 0;
  ThreadPlanOptions thread_planner;
  // An external orchestrator (several hosts): when the planner finds that role moves cannot
  // give what the load needs (PlannerDecision::Scale), this command is run with /bin/sh, at
  // most once per planner dwell time, with TANDEM_PLANNER_REQUEST=add_prefill|add_decode|remove,
  // TANDEM_PLANNER_WORKER (remove: the worker that may go; it holds no stream),
  // TANDEM_PLANNER_PREFILL_LOAD, TANDEM_PLANNER_DECODE_LOAD, TANDEM_PLANNER_PREFILL_WORKERS and
  // TANDEM_PLANNER_DECODE_WORKERS in its environment; its exit status is counted. Empty: none.
  std::string planner_hook;
  // The same requests to whoever starts and stops workers on this host (`tandem serve` within
  // --cores), at most once per dwell time: (request, worker) as for the hook. Called on the
  // planner's thread without the conductor's lock. May be empty.
  std::function<void(const std::string& request, const std::string& worker)> on_scale;
  // Global cache-aware placement: before placing a request, ask the cluster KV pool's master how
  // much of the prompt the pool holds (one call, bounded by 100 ms); a prefill worker that uses
  // the pool is predicted to fetch that prefix instead of computing it.
  bool pool_aware = true;
  // Adds metrics of parts that live beside the conductor (e.g. the embedded KV pool master) to
  // every Stats(); called without the conductor's lock. May be empty.
  std::function<void(serving::BackendStats*)> extra_metrics;
};

// What the conductor knows of one worker (for /metrics, logs and tests).
struct WorkerView {
  cluster::WorkerInfo info;
  bool healthy = false;
  int inflight = 0;
  cluster::WorkerStats stats;
  double predicted_queue_s = 0;
};

class Conductor : public serving::GenerationBackend {
 public:
  static StatusOr<std::unique_ptr<Conductor>> Start(ConductorOptions options);
  ~Conductor() override = default;

  // Blocks until at least `prefill` healthy prefill workers and `decode` healthy decode-capable
  // workers are known; DeadlineExceeded otherwise.
  virtual Status WaitForWorkers(int prefill, int decode, Clock::time_point deadline) = 0;
  virtual std::vector<WorkerView> Workers() const = 0;
  // Switches `worker` to `role` now (elastic pools, or an operator): the worker takes the new
  // role at once and finishes what it holds; the conductor places by the new role from here.
  // Counted in tandem_role_switches_total. NotFound for an unknown worker; the worker's error.
  virtual Status ChangeRole(const std::string& worker, cluster::Role role,
                            const std::string& reason) = 0;
  // Sets `worker`'s engine threads now (elastic pools, or an operator); counted in
  // tandem_thread_changes_total. NotFound for an unknown worker; the worker's error (e.g.
  // INVALID_ARGUMENT above its max_threads).
  virtual Status ChangeThreads(const std::string& worker, int threads,
                               const std::string& reason) = 0;
  // For a worker about to start on this host: frees up to `wanted` cores of core_budget now,
  // shrinking running workers as PlanThreads does when over budget (never below one thread),
  // and holds what it frees for the newcomer until a worker joins or `hold` passes. Returns the
  // cores held (0: none could be freed; without a core budget, `wanted`).
  virtual int ReserveCores(int wanted, Clock::duration hold) = 0;
  // Counted in tandem_worker_restarts_total (the supervisor restarted a worker process).
  virtual void CountWorkerRestart(cluster::Role role) = 0;
};

}  // namespace tandem::conductor
