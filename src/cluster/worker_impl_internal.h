// The worker (worker.h) inside: one class, its methods in four files by responsibility:
//   worker.cc          start-up (transfer engine, engine, cost models, KV pool), routes, stop
//   worker_control.cc  role and engine-thread changes and their publication (elastic pools)
//   worker_prefill.cc  prompts: prefill, the KV push to a decode worker, pipeline stages
//   worker_decode.cc   decode streams: KV reservations, the hand-off at kv_ready, tokens out
// Internal to src/cluster.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cluster/kv_pusher.h"
#include "cluster/pipeline_stage.h"
#include "cluster/pool_bridge.h"
#include "cluster/protocol.h"
#include "cluster/worker.h"
#include "common/http_status.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "serving/local_backend.h"
#include "transfer/transfer_engine.h"

namespace tandem::cluster::worker_internal {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline void ReplyError(httplib::Response& res, const Status& st) {
  res.status = HttpStatusFor(st.code());
  res.set_content(ErrorJson(st), "application/json");
}

class DecodeStream;  // one /v1/decode response's lines (worker_decode.cc)

class WorkerImpl final : public Worker {
 public:
  WorkerImpl() : log_(GetLogger("worker")) {}
  ~WorkerImpl() override;

  Status Init(const WorkerOptions& o);

  int port() const override { return port_; }
  const WorkerInfo& info() const override { return info_; }

  bool Run() override { return http_.listen_after_bind(); }
  void Stop(Clock::time_point deadline) override;

 private:
  // ---- start-up and routes (worker.cc) ----

  // The cost model at each thread count the engine may be resized to (elastic pools), each
  // loaded or calibrated as `cost_profile` says (a profile is keyed by its thread count); a
  // mock worker's model is the same at every count (its steps take the model's time however
  // many threads it has). Leaves the engine at its starting count.
  Status LoadCostModels(const WorkerOptions& o);

  // The cost model at `threads`: its own, else the starting count's scaled by the thread
  // ratio (ideal scaling, an optimistic stand-in), else none.
  conductor::CostModel CostAt(int threads) const;

  // The KV pool client, its DRAM segment and the serving loop's bridge to it.
  Status StartPool(int64_t incarnation, serving::SchedulerOptions* so);

  void Routes();

  // ---- role and threads (worker_control.cc) ----

  // Work of one kind in flight on this worker (a call being answered), counted for the life of
  // the object.
  class InFlight {
   public:
    explicit InFlight(std::atomic<int>* n) : n_(n) { n_->fetch_add(1); }
    ~InFlight() { n_->fetch_sub(1); }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    std::atomic<int>* n_;
  };

  void HandleRole(const httplib::Request& req, httplib::Response& res) TANDEM_EXCLUDES(role_mu_);

  // What the metadata service should hold for this worker now.
  WorkerInfo PublishedLocked() const TANDEM_REQUIRES(role_mu_);

  void HandleThreads(const httplib::Request& req, httplib::Response& res) TANDEM_EXCLUDES(role_mu_);

  // ---- prefill side (worker_prefill.cc) ----

  StatusOr<transfer::SegmentHandle> OpenSegment(const std::string& name)
      TANDEM_EXCLUDES(segments_mu_);

  // A segment whose transfer failed is closed: its owner may be gone (a restarted worker
  // publishes a new segment name).
  void DropSegment(const std::string& name) TANDEM_EXCLUDES(segments_mu_);

  void HandlePrefill(const httplib::Request& req, httplib::Response& res);

  void CountPushFailure(const KvPusher& pusher, const std::string& segment);

  // One stage of a pipelined prefill (protocol.h PipelineStage): this worker's layers of every
  // chunk, the previous stage's output in, the next stage's input out.
  void HandleStage(const PrefillCall& call, KvPusher& pusher, Clock::time_point deadline,
                   httplib::Response& res);

  // ---- decode side (worker_decode.cc) ----

  struct Pending {
    serving::GenerationRequest request;
    std::shared_ptr<DecodeStream> stream;
    Clock::time_point kv_deadline;
  };

  void HandleDecode(const httplib::Request& req, httplib::Response& res)
      TANDEM_EXCLUDES(pending_mu_);

  void OnClientGone(const std::string& id, DecodeStream& stream);

  // Frees the reservation of a request still waiting for its KV.
  void CancelPending(const std::string& id, const Status& why) TANDEM_EXCLUDES(pending_mu_);

  void ExpireKvWait(const std::string& id) TANDEM_EXCLUDES(pending_mu_);

  // Transfer-engine thread: queue the hand-off, never block here.
  void OnNotification(const transfer::Notification& n) TANDEM_EXCLUDES(handoff_mu_);

  void HandoffLoop() TANDEM_EXCLUDES(handoff_mu_);

  // "kv_ready": the request's KV is in its reserved blocks; start decoding it.
  void Handoff(const std::string& message) TANDEM_EXCLUDES(pending_mu_);

  // Set by Init() before the HTTP, hand-off and transfer-engine threads use them; then read-only
  // (te_, engine_ and backend_ are thread-safe themselves).
  WorkerOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<transfer::MetadataStore> metadata_;
  std::unique_ptr<transfer::TransferEngine> te_;
  std::string segment_name_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<store::PoolClient> pool_;  // outlives backend_, whose loop calls it
  std::string pool_namespace_;               // set with pool_, before the server starts
  std::unique_ptr<serving::LocalBackend> backend_;
  WorkerInfo info_;
  httplib::Server http_;
  int port_ = 0;

  Mutex segments_mu_;
  // Opened decode segments.
  std::map<std::string, transfer::SegmentHandle> segments_ TANDEM_GUARDED_BY(segments_mu_);

  StageInbox stage_inbox_;  // pipelined prefills: chunks from previous stages

  Mutex pending_mu_;
  // Decode side: reserved, waiting for KV.
  std::map<std::string, Pending> pending_ TANDEM_GUARDED_BY(pending_mu_);

  Mutex handoff_mu_;
  CondVar handoff_cv_;
  std::deque<std::string> handoffs_ TANDEM_GUARDED_BY(handoff_mu_);
  std::atomic<bool> handoff_stop_{false};  // set under handoff_mu_ (by the destructor)
  std::thread handoff_thread_;             // started by Init(), joined by the destructor

  // The role now (elastic pools: POST /v1/role changes it); read lock-free by the handlers.
  std::atomic<Role> role_{Role::kMixed};
  Mutex role_mu_;  // serialises role and thread changes and their publication
  int threads_ TANDEM_GUARDED_BY(role_mu_) = 0;  // the engine's thread count, as published
  std::map<int, conductor::CostModel> costs_;    // by thread count; fixed after Init
  std::atomic<int> prefills_in_flight_{0};
  std::atomic<int> decodes_in_flight_{0};  // decode streams being answered

  // Counters: lock-free.
  std::atomic<uint64_t> kv_bytes_pushed_{0};
  std::atomic<uint64_t> transfer_failures_{0};
  std::atomic<uint64_t> transfer_timeouts_{0};
  std::atomic<uint64_t> kv_wait_timeouts_{0};
};

}  // namespace tandem::cluster::worker_internal
