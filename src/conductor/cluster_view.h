// The conductor's view of its workers: membership (what the metadata service lists and each
// worker's last /stats), what each holds in its prefix cache, and what the conductor itself has
// placed there and not seen finish (prefill work queued, sequences decoding, KV blocks
// promised). From it, Snapshot() builds the policy's input for one request.
//
// Thread-safety: not thread-safe; the conductor guards it with its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cluster/protocol.h"
#include "conductor/policy/placement.h"
#include "conductor/worker_client.h"

namespace tandem::conductor {

// A request held by the conductor is sent to its prefill worker once at most this much
// predicted work (or its own prefill time, if longer) is ahead of it there (seconds).
inline constexpr double kDispatchAheadS = 0.25;

// A worker's role set by the conductor wins over a different one listed in the metadata service
// for this long (a listing taken before the change may arrive after it).
inline constexpr auto kRoleSettleTime = std::chrono::seconds(2);
// Time constant of a worker's busy share (an exponential moving average of its probes).
inline constexpr double kBusyAverageTime = 5.0;

// What one request asks of the cluster, as the view accounts it.
struct RequestLoad {
  uint64_t seq = 0;  // unique per request
  int prompt_tokens = 0;
  int max_tokens = 0;
  std::vector<uint64_t> keys;  // block keys of the prompt (block_tokens of the workers)
  int block_tokens = 0;        // of `keys`
  int pool_prompt_tokens = 0;  // prefix tokens the cluster KV pool held at arrival
};

class ClusterView {
 public:
  struct Worker {
    cluster::WorkerInfo info;
    bool healthy = false;
    Clock::time_point last_ok{};
    cluster::WorkerStats stats;
    std::shared_ptr<WorkerClient> client;
    std::unordered_set<uint64_t> reported_keys;  // its prefix cache at the last /stats
    // Keys of prompts placed there since: when, and by which request (a key counts for the
    // requests placed after that one; the request itself does not hold its own prompt yet).
    struct PlacedKey {
      Clock::time_point at;
      uint64_t seq = 0;
    };
    std::unordered_map<uint64_t, PlacedKey> placed_keys;
    std::unordered_set<uint64_t> placed;  // requests placed there and not finished (on a
                                          // prefill worker: until its prefill is done)
    struct PrefillJob {
      double predicted_s = 0;
      Clock::time_point started = Clock::time_point::max();  // sent to the worker at (max:
                                                             // still held by the conductor)
      double alone_s = -1;  // the first stage of a pipeline: its prediction alone (else -1)
    };
    std::map<uint64_t, PrefillJob> prefills;  // by request seq (remote, or local on a decoder)
    // When its last prefill ended: the job sent next started then at the earliest.
    Clock::time_point prefill_done_at{};
    struct DecodeJob {
      int64_t prompt_tokens = 0;
      int emitted = 0;
      int expected_tokens = 1;  // predicted length of its output
      double tbt_s = 0;         // predicted at placement
      Clock::time_point joins_at{};
      bool joined = false;
    };
    std::map<uint64_t, DecodeJob> decodes;
    struct Promise {
      int blocks = 0;
      Clock::time_point confirmed = Clock::time_point::max();  // reservation made at
    };
    std::map<uint64_t, Promise> promises;  // KV blocks placed, not yet seen in its /stats
    double kv_transfer_s = 0.002;          // moving average of the measured KV push tail
    // Moving averages of measured / predicted, applied to its cost model's predictions: the
    // profile was measured alone, the worker may share its cores now.
    double prefill_scale = 1.0;
    double decode_scale = 1.0;
    // Elastic pools: when the conductor last changed its role (a listing older than
    // kRoleSettleTime cannot undo it), and the share of wall time its engine computed, an
    // average over about kBusyAverageTime of its /stats busy seconds.
    Clock::time_point role_set_at{};
    // Likewise when the conductor last changed its engine threads (POST /v1/threads): the
    // listing's threads and cost (the model at that count) replace the view's once they agree
    // with it or after kRoleSettleTime.
    Clock::time_point threads_set_at{};
    bool listed = true;  // in the metadata service's last listing (false: it left, e.g. stopped)
    Clock::time_point joined_at{};  // its current incarnation's first probe
    double busy_share = 0;
    double busy_seconds = -1;          // at busy_sampled_at (-1: no sample yet)
    Clock::time_point last_busy_at{};  // the last sample that saw busy_seconds grow
    Clock::time_point busy_sampled_at{};
  };

  std::map<std::string, Worker>& workers() { return workers_; }
  const std::map<std::string, Worker>& workers() const { return workers_; }
  Worker* Find(const std::string& name);

  // A /stats answer (or failure) for the worker `info` from a probe started at `probe_start`.
  // Returns a log line when the worker joined, rejoined or went silent (empty otherwise).
  std::string ApplyProbe(const cluster::WorkerInfo& info,
                         const StatusOr<cluster::WorkerStats>& stats, Clock::time_point probe_start,
                         Clock::duration worker_timeout);
  // Forgets placed prompt keys older than their lifetime on `w` (a probe does this; so does
  // the simulator, which has no probes).
  static void ExpirePlacedKeys(Worker* w, Clock::time_point now);
  // The predicted step time of the decode batch the conductor placed on `w` and saw join
  // (0 without a cost model or sequences); *batch gets its size.
  static double DecodeStepSeconds(const Worker& w, int* batch);
  // Folds a /stats answer's busy seconds into w->busy_share (ApplyProbe does this).
  static void SampleBusy(Worker* w, const serving::BackendStats& b, Clock::time_point now);
  // Workers no longer listed: unhealthy. Returns their names.
  std::vector<std::string> MarkUnlisted(const std::unordered_set<std::string>& listed);

  // The policy's input for `r`, in the order of `names` (filled). Prefill queues count the work
  // placed before r.seq only (r itself may be placed already, waiting for its turn).
  std::vector<WorkerSnapshot> Snapshot(const RequestLoad& r, Clock::time_point now,
                                       std::vector<std::string>* names) const;

  // Accounting of a placement: decode on `decode`, prefill on `prefill` (empty: local).
  void Commit(const RequestLoad& r, const Placement& p, const std::string& decode,
              const std::string& prefill, int expected_output, Clock::time_point now);
  // The request is about to ask `decode` for its KV reservation: `blocks` count as taken there
  // until its /stats shows them, and its prefill (on `prefill`, or local) counts as started.
  // Returns false (nothing changes) when the blocks are not free now.
  bool Dispatch(uint64_t seq, const std::string& decode, const std::string& prefill, int blocks,
                Clock::time_point now);
  void ReservationMade(uint64_t seq, const std::string& decode, Clock::time_point now);
  // The prompt's KV is on the decode worker now (its prefix cache will hold it).
  void PrefillDone(const RequestLoad& r, const std::string& prefill, const std::string& decode,
                   double transfer_s, Clock::time_point now);
  // A prefill `worker` computed: `new_tokens` after `cached_tokens` from its prefix cache, in
  // `measured_s` of engine time (the worker's own figure, without queueing or transfer).
  // Corrects the worker's prefill predictions by measured / its cost model's prediction for
  // the same work (predictions under 0.1 s are ignored: fixed costs dominate them). Learning
  // from the TTFT instead would feed back: the TTFT includes the time held in the conductor's
  // queue, which the scale itself lengthens.
  void PrefillMeasured(const std::string& worker, int64_t new_tokens, int64_t cached_tokens,
                       double measured_s);
  // A request's mean time between tokens on `decode` against the prediction.
  void DecodeMeasured(const std::string& decode, double predicted_tbt_s, double measured_tbt_s);
  void TokenEmitted(uint64_t seq, const std::string& decode);
  // The request's prefill moves to `prefill` (a retry after a failure), sent at once.
  void ReassignPrefill(uint64_t seq, const std::string& prefill, double predicted_prefill_s,
                       Clock::time_point now);
  // A pipelined prefill of the request (placed on prefill worker stages[0]) starts now over
  // `stages`, each busy for about `predicted_s` seconds of its cost model
  // (LayerSplit::pipelined_seconds; scaled by each worker's prefill_scale): every stage's
  // queue holds it until PipelineEnded, the first stage's in place of the one-worker prefill.
  void PipelineStarted(uint64_t seq, const std::vector<std::string>& stages, double predicted_s,
                       Clock::time_point now);
  // The pipeline is over: the later stages are free of it. The first stage's job goes with
  // PrefillDone when it succeeded; when it failed, the one-worker prefill that follows there
  // gets back its prediction alone, from now.
  void PipelineEnded(uint64_t seq, const std::vector<std::string>& stages, bool succeeded,
                     Clock::time_point now);
  // Forgets everything of the request on both workers (finished, failed or re-placed).
  void Release(uint64_t seq, const std::string& decode, const std::string& prefill);

  // Predicted prefill work queued on `w` at `now` (seconds): all of it, or only the part
  // placed before request `before_seq` (prefills run in placement order).
  static double QueueSeconds(const Worker& w, Clock::time_point now,
                             uint64_t before_seq = UINT64_MAX);
  // KV blocks of `w` free or evictable at its last /stats, minus those promised since (other
  // than request `except_seq`'s). kv_blocks_used counts reserved blocks too.
  static int FreeBlocks(const Worker& w, uint64_t except_seq = 0);

 private:
  std::map<std::string, Worker> workers_;
};

WorkerRole ToPolicyRole(cluster::Role r);

}  // namespace tandem::conductor
