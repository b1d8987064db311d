// A worker: one engine instance (its own paged KV pool inside a transfer-engine segment), its
// continuous-batching loop, and a control endpoint speaking the protocol of protocol.h. Role
// prefill computes prompts and pushes their KV to decode workers layer by layer; role decode
// reserves blocks, receives KV and generates; role mixed does both (and whole requests).
//
//   auto w = Worker::Start(options);   // loads the model, binds, publishes itself
//   (*w)->Run();                       // serves until Stop()
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "common/status.h"
#include "engine/engine.h"
#include "serving/local_backend.h"
#include "transfer/transfer_engine.h"

namespace tandem::cluster {

// A worker's engine defaults: the engine's own, with a 16k-token KV cache.
inline engine::EngineOptions WorkerEngineDefaults() {
  engine::EngineOptions o;
  o.kv_capacity_tokens = 16384;
  return o;
}

// What a worker is made of: its engine and scheduler (their own options, embedded as they are,
// so a knob of either is defined in one place) and the worker's own settings.
struct WorkerOptions {
  std::string name;          // unique in the cluster
  Role role = Role::kMixed;  // at start
  // model_path, threads, block_tokens, kv_capacity_tokens (the worker sets kv_memory: its KV
  // lives in a transfer-engine segment).
  engine::EngineOptions engine = WorkerEngineDefaults();
  serving::SchedulerOptions scheduler;
  std::string host = "127.0.0.1";  // control endpoint (and advertised address)
  int port = 0;                    // 0: any free port
  std::string metadata_uri;        // "http://...", "etcd://..."
  std::vector<transfer::Protocol> protocols = {transfer::Protocol::kShm, transfer::Protocol::kTcp};
  int http_threads = 256;
  // A KV push batch that has not landed this long after it was submitted fails (counted in
  // transfer_timeouts); the prefill then fails and the conductor retries elsewhere.
  std::chrono::milliseconds kv_transfer_timeout{10000};
  // The cost model published for the conductor's predictions (calibration.h LoadOrCalibrate):
  // "auto", "calibrate", "none" or a profile file.
  std::string cost_profile = "auto";
  // A mock worker (cluster/mock_step.h) when set: its engine computes nothing and takes this
  // model's time per step; it publishes this model as its cost (cost_profile is not used).
  std::optional<conductor::CostModel> mock_cost;
  // The cluster KV pool (store/pool.h; its master is found in the metadata service): prompts
  // fetch what the local prefix cache lacks, finished sequences offer their blocks, and the
  // worker contributes pool_dram_bytes of shared memory as a storage segment (0: none).
  // Sliding-window models store the windows behind each offered prefix's end as well.
  bool kv_pool = true;
  uint64_t pool_dram_bytes = uint64_t{256} << 20;
  // The pool's SSD tier of this worker (store/ssd_tier.h): a directory of its own (empty:
  // none) and its capacity.
  std::string pool_ssd_dir;
  uint64_t pool_ssd_bytes = 0;
};

// A worker's role can change while it runs (POST /v1/role, elastic pools); info() keeps what it
// published at start, the metadata service has its current WorkerInfo.
//
// Thread-safety: port() and info() are fixed once Start() returns (read them from any thread);
// Run() serves on the calling thread until Stop(), which may be called from another thread.
class Worker {
 public:
  static StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options);
  virtual ~Worker() = default;
  virtual int port() const = 0;
  virtual const WorkerInfo& info() const = 0;
  // Serves until Stop(); false if the server could not run.
  virtual bool Run() = 0;
  // Unpublishes the worker, stops accepting, lets requests in flight finish until `deadline`.
  virtual void Stop(std::chrono::steady_clock::time_point deadline) = 0;
};

}  // namespace tandem::cluster
