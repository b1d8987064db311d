// Placement and admission of one request: a pure function over a snapshot of the cluster, so
// that it is tested without sockets, replayed by the simulator, and replaced without touching
// the request plumbing (conductor.cc builds the snapshot and carries the decision out).
//
// The default policy (kCacheLoad) follows Mooncake's conductor (FAST'25, Algorithm 1):
//   - for every prefill worker p: predicted TTFT(p) = queue(p) + prefill of the part of the
//     prompt p does not hold in its prefix cache + KV transfer tail;
//   - the prefill worker with the lowest predicted TTFT wins (a worker that holds a longer
//     prefix but is busy loses to an idle one that recomputes it);
//   - the decode worker: among those with KV room, the lowest predicted step time with this
//     request joined (or, with pack_decode, the busiest that still meets the TBT SLO, so that
//     idle ones can be released by a planner);
//   - with no prefill workers (colocated, mixed workers only) the decode worker is the one
//     with the lowest predicted TTFT among those that keep the TBT SLO;
//   - conditional disaggregation: if computing the prompt on the chosen decode worker itself
//     (chunked into its decode steps) gives a clearly lower TTFT (local_prefill_gain) and keeps
//     its TBT within the SLO, the prompt is computed there (`local`);
//   - admission: with SLOs, a request whose best predicted TTFT or TBT breaks them is rejected
//     before any work is spent. kPredictive judges the decode batch as it will be when the
//     prefill finishes (requests predicted to end by then leave, those in prefill join), not
//     as it is now, which damps the anti-phase swing of prefill and decode load.
// A decode side with no KV room now is not a rejection: the request waits (kWait).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "conductor/policy/cost_model.h"

namespace tandem::conductor {

enum class WorkerRole { kPrefill, kDecode, kMixed };

enum class PlacementPolicy {
  kRandom,       // any healthy worker, uniformly
  kLoadBalance,  // fewest requests in flight (no cache, no cost model)
  kCacheAware,   // the prefill worker holding the longest prefix among those with at most 2
                 // requests in flight more than the least loaded; ties by load
  kCacheLoad,    // minimum predicted TTFT (cache and load), SLO-aware decode (default)
};
const char* PlacementPolicyName(PlacementPolicy p);  // "random", "load-balance", ...
StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name);

enum class AdmissionPolicy {
  kNone,        // never reject for an SLO (requests queue)
  kEarly,       // reject when the prediction on the current load breaks an SLO
  kPredictive,  // the same with the decode load predicted at the end of the prefill (default)
};
const char* AdmissionPolicyName(AdmissionPolicy p);  // "none", "early", "predictive"
StatusOr<AdmissionPolicy> ParseAdmissionPolicy(const std::string& name);

// A sequence decoding on a worker, as the conductor predicts it (times relative to now).
struct DecodeSequence {
  int64_t context_tokens = 0;  // prompt + tokens generated so far
  double joins_in_s = 0;       // > 0: still in prefill, joins the batch then
  double ends_in_s = 0;        // predicted end (expected remaining tokens x predicted TBT)
};

// One worker, as seen for this request.
struct WorkerSnapshot {
  std::string name;
  WorkerRole role = WorkerRole::kMixed;
  bool healthy = false;
  int inflight = 0;        // requests placed there and not finished (any role)
  int kv_free_blocks = 0;  // free + evictable, minus blocks promised since the last report
  int block_tokens = 16;
  int cached_prompt_tokens = 0;          // tokens of this prompt's prefix it holds (whole blocks)
  double prefill_queue_s = 0;            // predicted prefill work placed there, not yet done
  std::vector<DecodeSequence> decoding;  // decode side: its batch
  CostModel cost;                        // invalid: no predictions (falls back to load)
  double kv_transfer_s = 0;              // measured tail of KV pushes from this prefill worker
  int max_batch_tokens = 256;            // tokens per step (the chunk of a local prefill)
};

struct RequestShape {
  int prompt_tokens = 0;
  int max_tokens = 0;
  int expected_output_tokens = 0;  // for predicted ends of decodes (<= max_tokens)
  double slo_ttft_s = 0;           // 0: none
  double slo_tbt_s = 0;            // 0: none
};

struct PlacementOptions {
  PlacementPolicy policy = PlacementPolicy::kCacheLoad;
  AdmissionPolicy admission = AdmissionPolicy::kPredictive;
  bool allow_local_prefill = true;  // conditional disaggregation (kCacheLoad only)
  // Local only when its predicted TTFT is at most this fraction of the remote one: a decode
  // worker's time is its batch's, so a gain of a few milliseconds (the transfer) is not worth it.
  double local_prefill_gain = 0.8;
  // Pack decode work onto the busiest worker that meets the TBT SLO (for a planner that releases
  // idle workers). Off by default: with a fixed pool packing only concentrates KV, and the
  // reservations that no longer fit there come back as waits (the simulator measured twice
  // the KV waits, and the TTFT misses they cause, at a 200 ms TBT SLO).
  bool pack_decode = false;
  uint64_t random_draw = 0;  // kRandom: the caller's random number
};

struct Placement {
  enum class Outcome {
    kPlaced,
    kWait,      // no decode worker has KV room now: try again when some is freed
    kReject,    // an SLO cannot be met (reason "ttft_slo" / "tbt_slo"): 429
    kNoWorker,  // no healthy decode worker (reason "no_decode_worker"): 503
  };
  Outcome outcome = Outcome::kNoWorker;
  int prefill = -1;                // index into the snapshot; -1 when local
  int decode = -1;                 // index into the snapshot
  bool local = false;              // the decode worker computes the prompt
  std::string reason;              // short code, for metrics
  std::string message;             // for the client
  double predicted_ttft_s = 0;     // of the chosen placement (0 without a cost model)
  double predicted_tbt_s = 0;      // decode step time once joined (0 without a cost model)
  double predicted_prefill_s = 0;  // the prefill part of predicted_ttft_s
  double retry_after_s = 0;        // kReject / kWait: when trying again may succeed
  int decode_cached_tokens = 0;    // prompt tokens the decode worker already holds
};

// Fresh KV blocks a decode worker reserves for a prompt of `prompt_tokens` (plus the first
// generated token) when its prefix cache holds the first `cached_tokens` (whole blocks);
// block_tokens <= 0 counts as 16.
int DecodeBlocksNeeded(int prompt_tokens, int cached_tokens, int block_tokens);

// The decode batch of `w` at `t_s` seconds from now, with one more sequence of `extra_context`
// tokens: (batch, total context tokens).
std::pair<int64_t, int64_t> DecodeBatchAt(const WorkerSnapshot& w, double t_s,
                                          int64_t extra_context);

// Predicted time between tokens of a request joining `decode`'s batch `join_s` from now: the
// decode step of that batch, plus the prefill work queued on the worker itself (local
// prefills) spread over the request's expected tokens, at most one chunk per step.
double PredictTbt(const WorkerSnapshot& decode, const RequestShape& r, double join_s);
// Predicted TTFT if `prefill` computes the request for `decode`'s batch (seconds).
double PredictRemoteTtft(const WorkerSnapshot& prefill, const RequestShape& r);
// Predicted TTFT if `decode` computes the prompt itself, in chunks mixed into its steps.
double PredictLocalTtft(const WorkerSnapshot& decode, const RequestShape& r);

// exclude_prefill: snapshot indices not to use as prefill worker (failed before).
Placement Place(std::span<const WorkerSnapshot> workers, const RequestShape& request,
                const PlacementOptions& options, std::span<const int> exclude_prefill = {});

}  // namespace tandem::conductor
