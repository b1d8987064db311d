// The control protocol between the conductor and its workers (JSON over HTTP on the worker's
// control port), and what a worker publishes in the metadata service.
//
// Worker routes:
//   GET  /health                      {"name", "role"}; 200 while serving
//   GET  /stats                       WorkerStats (with the keys of its cached KV blocks)
//   POST /v1/decode   DecodeCall  ->  a stream of newline-delimited DecodeEvents:
//                                     "reserved" (unless local), then "prompt_logprobs" (if
//                                     asked), "token"..., then one "finish" or "error"
//   POST /v1/prefill  PrefillCall ->  PrefillResult (200) or {"error": {...}} (4xx/5xx)
//   POST /v1/cancel   {"id"}      ->  frees what the worker holds for the request
//   POST /v1/stage_input StageInput -> {} once the chunk is queued for the request's stage
//                                     (a pipelined prefill, see PipelineStage)
//   POST /v1/role     RoleChange  ->  RoleChangeResult: the worker takes the new role at once
//                                     (calls of a kind it no longer does are refused with
//                                     FAILED_PRECONDITION), lets the work it holds finish, and
//                                     republishes its WorkerInfo
//   POST /v1/threads  ThreadsChange ->  ThreadsChangeResult: the engine computes on that many
//                                     threads from its next step (within the worker's
//                                     --max-threads; INVALID_ARGUMENT outside) and the worker
//                                     republishes its WorkerInfo (threads, cost at that count)
// Metadata: "tandem/workers/<name>" -> WorkerInfo, under the worker's lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "conductor/policy/cost_model.h"
#include "engine/sampling_params.h"
#include "serving/backend.h"
#include "store/pool_stats.h"

namespace tandem::cluster {

using Clock = std::chrono::steady_clock;

enum class Role { kPrefill, kDecode, kMixed };
const char* RoleName(Role r);  // "prefill", "decode", "mixed"
StatusOr<Role> ParseRole(const std::string& s);
inline bool CanPrefill(Role r) { return r != Role::kDecode; }
inline bool CanDecode(Role r) { return r != Role::kPrefill; }

inline constexpr const char* kWorkersPrefix = "tandem/workers/";

// Published by each worker. The KV geometry lets peers check they agree before moving blocks.
struct WorkerInfo {
  std::string name;  // unique in the cluster, e.g. "decode-0"
  Role role = Role::kMixed;
  std::string host;  // control endpoint
  int port = 0;
  int pid = 0;
  std::string kv_segment;  // transfer-engine segment holding the KV pool
  int block_tokens = 0;
  int n_layers = 0;
  uint64_t layer_slice_bytes = 0;
  int kv_blocks = 0;
  std::string model;           // file name of the model, to refuse mismatched pairs
  int64_t incarnation = 0;     // start time (ms since epoch): a restarted worker differs
  int max_batch_tokens = 256;  // tokens per forward step (chunk of a local prefill)
  int max_num_seqs = 0;        // sequences decoded at once at most (0: unknown)
  conductor::CostModel cost;   // at `threads`, fitted at start or loaded; invalid: none
  int threads = 0;             // engine threads now (0: not said, an older worker)
  int max_threads = 0;         // what POST /v1/threads may set (0: not said)
  // Per layer: the window its queries see (tokens), 0 for full attention. Empty: every layer
  // is global. With `cost`, what the conductor splits a pipelined prefill's layers by.
  std::vector<int> layer_windows = {};
  int model_dim = 0;  // width of the residual stream (a pipeline stage's output per token)

  std::string ToJson() const;
  static StatusOr<WorkerInfo> FromJson(const std::string& json);
};

struct WorkerStats {
  serving::BackendStats backend;
  bool pool_enabled = false;       // the worker uses the cluster KV pool (store/pool.h)
  std::string pool_namespace;      // its objects' namespace (store::PoolNamespace)
  store::PoolClientStats pool;     // its client's counters
  uint64_t kv_bytes_pushed = 0;    // prefill side: KV written to decode workers
  uint64_t transfer_failures = 0;  // batches that failed
  uint64_t transfer_timeouts = 0;  // batches that timed out
  uint64_t kv_wait_timeouts = 0;   // decode side: reservations whose KV never came
  uint64_t auth_refusals = 0;      // peers refused for want of the cluster token (all endpoints)
  // Keys (serving/block_keys.h) of the KV blocks in the worker's prefix cache, in no order:
  // the conductor's view of what each worker holds (cache-aware placement).
  std::vector<uint64_t> cached_block_keys;

  std::string ToJson() const;
  static StatusOr<WorkerStats> FromJson(const std::string& json);
};

// Where the prefill worker writes a request's KV.
struct KvTarget {
  std::string segment;          // the decode worker's KV segment
  std::vector<int32_t> blocks;  // reserved blocks, position order
  int block_tokens = 0;
  int n_layers = 0;
  uint64_t layer_slice_bytes = 0;
  std::string decode_worker;  // for logs and notifications
  int skip_blocks = 0;        // the first skip_blocks hold the prompt's prefix already
                              // (the decode side's prefix cache): not to be written
  // Sliding-window models (engine::PagedKvCache): per block, the window block holding its
  // sliding layers' slices, or -1 where the decode side needs none; where the window arena
  // starts in the segment; the window. Empty / 0 without sliding layers.
  std::vector<int32_t> window_blocks = {};
  uint64_t window_arena_offset = 0;
  int window_tokens = 0;
};

struct DecodeCall {
  std::string id;
  std::vector<int32_t> prompt_tokens;
  int max_tokens = 16;
  bool ignore_eos = false;
  engine::SamplingParams sampling;
  int64_t timeout_ms = 600000;  // the request's remaining time
  int64_t kv_wait_ms = 60000;   // how long the reservation waits for its KV
  bool reuse_prefix = true;     // reserve only the blocks the decode side's cache lacks
  bool local = false;           // compute the prompt here (no prefill worker)
  // local only: output the request already streamed from a decode worker that failed; this
  // worker computes it after the prompt and continues the stream (GenerationRequest).
  std::vector<int32_t> resumed_output = {};

  std::string ToJson() const;
  static StatusOr<DecodeCall> FromJson(const std::string& json);
};

// Chunked pipeline-parallel prefill (Mooncake's CPP): one long prompt's prefill spread over a
// group of prefill workers. Stage i computes layers [begin_layer, end_layer) of every chunk of
// chunk_tokens positions, in order, and passes each chunk's residual stream (chunk x model_dim
// floats) to stage i + 1 (POST /v1/stage_input), so that different chunks of one prompt are
// computed at the same time on different workers. Every stage writes its own layers' KV into
// the decode worker's reservation as a whole prefill would. The last stage samples the first
// token and sends the notification; an earlier stage hands its last chunk on only once its KV
// has landed, so the notification still means "all of it is there".
struct PipelineStage {
  // Names this attempt's pipeline on every stage (the request id and an attempt number): the
  // chunks between stages carry it, and POST /v1/cancel with it as the id stops every stage.
  std::string session = {};
  int index = 0;   // 0 .. stages - 1
  int stages = 1;  // 1: not pipelined
  int begin_layer = 0;
  int end_layer = 0;  // exclusive
  int chunk_tokens = 1024;
  // The next stage's worker (every stage but the last).
  std::string next_worker = {}, next_host = {};
  int next_port = 0;

  bool pipelined() const { return stages > 1; }
  bool last() const { return index + 1 == stages; }
};

struct PrefillCall {
  std::string id;
  std::vector<int32_t> prompt_tokens;
  engine::SamplingParams sampling;
  int64_t timeout_ms = 600000;
  KvTarget target;
  PipelineStage stage;  // one stage of a pipelined prefill when stage.pipelined()

  std::string ToJson() const;
  static StatusOr<PrefillCall> FromJson(const std::string& json);
};

struct PrefillResult {
  engine::SampledToken first_token;  // with its logprobs when the call asked for them
  int cached_tokens = 0;
  double queue_seconds = 0;
  double prefill_seconds = 0;   // first scheduled -> last layer computed
  double transfer_seconds = 0;  // KV still moving after that
  uint64_t kv_bytes = 0;
  // A pipeline stage (PipelineStage): the residual-stream bytes it sent to the next stage, and
  // the seconds it spent waiting for the previous stage's chunks (its pipeline bubbles). An
  // earlier stage's first_token is -1.
  uint64_t stage_bytes_sent = 0;
  double stage_wait_seconds = 0;

  std::string ToJson() const;
  static StatusOr<PrefillResult> FromJson(const std::string& json);
};

// One chunk of a pipelined prefill's residual stream, from a stage to the next; or, with a
// non-OK error, the news that the sending stage failed. On the wire: this header as one JSON
// line, "\n", then n x dim little-endian float32 values.
struct StageInput {
  std::string id;  // the pipeline's session (PipelineStage::session)
  int start = 0;   // position of the chunk's first token
  int n = 0;       // tokens in the chunk
  bool last = false;
  Status error;
  std::vector<float> hidden;  // (n, dim)

  std::string Encode() const;
  // InvalidArgument unless hidden holds n x dim values (dim > 0).
  static StatusOr<StageInput> Decode(std::string_view body, int dim);
};

// One line of the /v1/decode stream.
struct DecodeEvent {
  enum class Kind { kReserved, kToken, kPromptLogprobs, kFinish, kError };
  Kind kind = Kind::kToken;
  KvTarget reserved;                                  // kReserved
  engine::SampledToken token;                         // kToken
  std::vector<engine::SampledToken> prompt_logprobs;  // kPromptLogprobs
  serving::FinishInfo finish;  // kFinish (reason, counts, first_decode_seconds)
  Status error;                // kError

  std::string ToJson() const;  // one line, no newline
  static StatusOr<DecodeEvent> FromJson(const std::string& json);
};

// A role switch (elastic pools): nothing is reloaded; the KV memory is one paged pool that
// serves either role (a prefill worker's prefix cache is a decode worker's too).
struct RoleChange {
  Role role = Role::kMixed;
  std::string reason;  // for the worker's log

  std::string ToJson() const;
  static StatusOr<RoleChange> FromJson(const std::string& json);
};

struct RoleChangeResult {
  Role role = Role::kMixed;
  Role previous = Role::kMixed;
  // Work of the previous role still in flight at the switch; it finishes as it would have.
  int prefills_in_flight = 0;
  int decodes_in_flight = 0;

  std::string ToJson() const;
  static StatusOr<RoleChangeResult> FromJson(const std::string& json);
};

// A thread-count change (elastic pools move cores between the workers of one host).
struct ThreadsChange {
  int threads = 0;
  std::string reason;  // for the worker's log

  std::string ToJson() const;
  static StatusOr<ThreadsChange> FromJson(const std::string& json);
};

struct ThreadsChangeResult {
  int threads = 0;
  int previous = 0;

  std::string ToJson() const;
  static StatusOr<ThreadsChangeResult> FromJson(const std::string& json);
};

// {"error": {"code": "UNAVAILABLE", "message": "..."}} and back.
std::string ErrorJson(const Status& st);
Status StatusFromErrorJson(const std::string& json, const std::string& fallback);

}  // namespace tandem::cluster
