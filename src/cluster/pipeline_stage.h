// One stage of a chunked pipeline-parallel prefill on a prefill worker (protocol.h
// PipelineStage): the inbox where the previous stage's chunks wait, and the loop that computes
// the stage's layers chunk by chunk on the worker's engine, pushes their KV to the decode worker
// and hands each chunk's residual stream to the next stage.
//
//   chunk k:   stage 0 [layers 0..s)  ->  stage 1 [layers s..L)  -> (last chunk) first token
//   chunk k+1: stage 0 computes it while stage 1 computes chunk k
//
// Each stage keeps its own KV of the whole prompt (its layers' slices are the ones it writes and
// sends; attention over earlier chunks reads them) in blocks allocated from the engine's cache
// for the life of the stage, outside the scheduler (serving::LocalBackend::RunExclusive).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cluster/kv_pusher.h"
#include "cluster/protocol.h"
#include "common/mutex.h"
#include "common/status.h"
#include "engine/sampling_params.h"
#include "serving/local_backend.h"

namespace tandem::cluster {

// The chunks sent to this worker's stages, per request, and their cancellation. A chunk may
// arrive before its stage has started (the stages' calls race): it waits in a session opened by
// whichever comes first. Sessions nobody touched for kStaleAfter are dropped.
//
// Thread-safety: thread-safe (HTTP threads put, stage threads take).
class StageInbox {
 public:
  static constexpr auto kStaleAfter = std::chrono::minutes(2);
  // Chunks queued per request before Put waits (backpressure on the previous stage).
  static constexpr size_t kMaxQueued = 2;

  // Sessions are keyed by PipelineStage::session (one per attempt, so a cancellation is never
  // left over for a later one). A stage of session `id` starts here.
  void Open(const std::string& id) TANDEM_EXCLUDES(mu_);
  // Queues a chunk (or the previous stage's failure). Waits while kMaxQueued chunks of the
  // request are queued, until they are taken, the session ends, or `deadline`.
  Status Put(StageInput in, Clock::time_point deadline) TANDEM_EXCLUDES(mu_);
  // The next chunk of `id`. DeadlineExceeded at `deadline`; the previous stage's error;
  // Cancelled after Fail.
  StatusOr<StageInput> Take(const std::string& id, Clock::time_point deadline) TANDEM_EXCLUDES(mu_);
  // Ends `id`'s stage with `why` (the conductor cancelled it), whether it started yet or not:
  // Take and Put return it, Failed says it.
  void Fail(const std::string& id, const Status& why) TANDEM_EXCLUDES(mu_);
  Status Failed(const std::string& id) const TANDEM_EXCLUDES(mu_);
  void Close(const std::string& id) TANDEM_EXCLUDES(mu_);

 private:
  struct Session {
    std::vector<StageInput> queued;  // in arrival order
    Status failed;
    bool open = false;  // a stage is running for it
    Clock::time_point touched;
  };
  Session& SessionLocked(const std::string& id) TANDEM_REQUIRES(mu_);
  void DropStaleLocked() TANDEM_REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, Session> sessions_ TANDEM_GUARDED_BY(mu_);
};

struct StageRun {
  std::string id;       // the request's
  std::string session;  // the pipeline's (PipelineStage::session): the inbox key
  std::vector<int32_t> prompt;
  PipelineStage stage;
  engine::SamplingParams sampling;  // the last stage samples the first token with it
  Clock::time_point deadline;
};

struct StageOutcome {
  engine::SampledToken first_token;  // the last stage's; token -1 otherwise
  uint64_t bytes_sent = 0;           // residual stream sent to the next stage
  double wait_seconds = 0;           // waiting for the previous stage's chunks
  double compute_seconds = 0;        // this stage's forward passes
};

// Runs one stage of `run` to its end on `backend`'s engine: takes each chunk's input from
// `inbox` (stages after the first), computes layers [begin_layer, end_layer), lets `pusher`
// send their KV as they are written, and gives each chunk's output to `send_next` (stages
// before the last; the last chunk only once this stage's KV has landed). The last stage samples
// the first token and completes the push with notify(first token) as its notification. On
// failure a stage before the last tells the next one (send_next with an error). The stage's KV
// blocks are freed before it returns, whatever happened.
StatusOr<StageOutcome> RunPipelineStage(
    const StageRun& run, serving::LocalBackend& backend, KvPusher& pusher, StageInbox& inbox,
    const std::function<Status(const StageInput&)>& send_next,
    const std::function<std::string(const engine::SampledToken&)>& notify);

}  // namespace tandem::cluster
