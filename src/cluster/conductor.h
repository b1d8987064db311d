// The conductor's side of disaggregated serving: a serving::GenerationBackend (so the OpenAI
// front door of src/server is unchanged) that places each request on a prefill and a decode
// worker found in the metadata service, drives the hand-off and relays the tokens.
//
// Request flow (protocol.h): the decode worker reserves KV blocks and says where they are
// ("reserved"); the prefill worker computes the prompt, writes its KV into those blocks layer by
// layer and answers with the first token, which goes to the client at once; the decode worker,
// notified by the transfer engine, continues and streams the rest.
//
// Failures: a prefill worker that fails is replaced by another (the reservation is kept); with
// none left the decode worker computes the prompt itself ("local", counted as served without
// disaggregation). A decode worker that fails ends its requests with an error. Each request has
// its deadline passed to every worker; nothing waits past it.
//
// Threading: one thread per request in flight (they mostly wait on sockets) and one heartbeat
// thread that refreshes membership and load every `heartbeat`.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cluster/policy.h"
#include "cluster/protocol.h"
#include "serving/backend.h"
#include "transfer/metadata.h"

namespace tandem::cluster {

struct ConductorOptions {
  std::shared_ptr<transfer::MetadataStore> metadata;  // where workers publish themselves
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds worker_timeout{2000};  // silent this long: unhealthy
  std::chrono::milliseconds kv_wait{60000};        // a reservation waits this long for its KV
  int max_inflight = 1024;                          // beyond: ResourceExhausted (429)
  int vocab_size = 0;                               // > 0: token ids are checked at Submit
  int max_model_len = 0;                            // > 0: prompt + max_tokens are checked
};

// What the conductor knows of one worker (for /metrics, logs and tests).
struct WorkerView {
  WorkerInfo info;
  bool healthy = false;
  int inflight = 0;
  WorkerStats stats;
};

class Conductor : public serving::GenerationBackend {
 public:
  static StatusOr<std::unique_ptr<Conductor>> Start(ConductorOptions options);
  ~Conductor() override = default;

  // Blocks until at least `prefill` healthy prefill workers and `decode` healthy decode-capable
  // workers are known; DeadlineExceeded otherwise.
  virtual Status WaitForWorkers(int prefill, int decode, Clock::time_point deadline) = 0;
  virtual std::vector<WorkerView> Workers() const = 0;
  // Counted in tandem_worker_restarts_total (the supervisor restarted a worker process).
  virtual void CountWorkerRestart(Role role) = 0;
};

}  // namespace tandem::cluster
