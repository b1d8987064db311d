// Private to ucx_transport*.cc: the decoded UCX segment address, the progress-thread state
// (requests, flush groups, endpoints, peers, mapped regions) and the UcxWorker class that owns
// it. UcxWorker is implemented in ucx_transport_worker.cc (lifecycle, progress loop, region
// mapping, the request path) and ucx_transport_endpoint.cc (endpoints and connections).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/status.h"
#include "transfer/transport.h"
#include "transfer/ucx_transport.h"

namespace tandem::transfer::internal {

// The decoded form of SegmentDescriptor::ucx_address.
struct UcxAddress {
  std::string worker;  // raw ucp worker address bytes
  uint64_t base = 0;   // the segment's virtual address in the owner
  std::string rkey;    // raw packed rkey bytes
};

// A Status for a failed UCX call: "what: <UCX's message>".
Status UcsStatus(const std::string& what, ucs_status_t st);

class UcxWorker;
struct Endpoint;

// One outstanding request. Owned by the worker (all_ops_); touched only on the progress thread.
struct Op {
  UcxWorker* worker = nullptr;
  CompletionCallback done;  // empty once called: the request's one terminal report
  Clock::time_point deadline;
  Endpoint* endpoint = nullptr;  // kept alive by the worker until shutdown
  int refs = 0;                  // UCX completions still to come (the request, the flush)
  Status status;                 // the report once UCX let go of the buffer (first error wins)
};

// Writes waiting for one endpoint flush (remote completion of every put issued before it).
struct FlushGroup {
  UcxWorker* worker = nullptr;
  std::vector<Op*> ops;
};

struct Peer;

// One UCP endpoint to a peer. Replaced (force-closed, then recreated on demand) when one of its
// requests passes its deadline, since RMA cannot be cancelled one request at a time.
struct Endpoint {
  UcxWorker* worker = nullptr;
  Peer* peer = nullptr;
  ucp_ep_h ep = nullptr;
  bool closing = false;
  std::unordered_map<uint64_t, ucp_rkey_h> rkeys;  // by rkey id; unpacked for this endpoint
  std::unordered_set<Op*> ops;                     // unreported requests issued on it
  std::vector<Op*> unflushed;                      // writes issued since the last flush
};

// A segment's packed rkey and base address in its owner.
struct RemoteKey {
  std::string packed;
  uint64_t base = 0;
};

// A remote worker address; touched only on the progress thread.
struct Peer {
  uint64_t id = 0;
  std::string key;      // raw worker address
  bool failed = false;  // the peer died: no new endpoint
  Status error;
  std::unordered_map<uint64_t, RemoteKey> packed;  // by rkey id (one per opened segment)
  std::shared_ptr<Endpoint> current;               // null until needed
};

// A region of this process mapped with ucp_mem_map.
struct MappedRegion {
  ucp_mem_h memh = nullptr;
  uint64_t size = 0;     // bytes
  std::string rkey_hex;  // empty for local-only regions
};

// The UCP context, worker and progress thread. Shared by the transport and its remote segments
// so that a segment closed after the transport still finds it (then only as a stopped shell).
class UcxWorker {
 public:
  explicit UcxWorker(UcxTransportOptions options, std::string name)
      : options_(std::move(options)), name_(std::move(name)), log_(GetLogger("transfer")) {}
  ~UcxWorker();

  Status Init();
  // Ends every request (Cancelled) once UCX let go of its buffer; joins the progress thread.
  void Stop() TANDEM_EXCLUDES(mu_);

  // Runs fn on the progress thread. False if the thread is stopping (fn is dropped).
  bool Post(std::function<void()> fn) TANDEM_EXCLUDES(mu_);
  // Runs fn on the progress thread and waits for its result, at most options_.open_timeout_ms.
  template <typename T>
  StatusOr<T> Call(std::function<StatusOr<T>()> fn);

  // Progress-thread operations.
  StatusOr<std::string> MapRegion(void* base, uint64_t size, bool publish);
  void UnmapRegion(void* base);
  StatusOr<std::pair<uint64_t, uint64_t>> Connect(const UcxAddress& addr);  // peer id, rkey id
  void ReleaseRkey(uint64_t peer_id, uint64_t rkey_id);
  void StartOp(bool write, uint64_t peer_id, uint64_t rkey_id, uint64_t remote_addr, void* local,
               uint64_t length, Clock::time_point deadline, CompletionCallback done);

  const std::string& worker_hex() const { return worker_hex_; }

  // UCX callbacks (progress thread).
  static void OnRequestDone(void* request, ucs_status_t st, void* user);
  static void OnFlushDone(void* request, ucs_status_t st, void* user);
  static void OnCloseDone(void* request, ucs_status_t st, void* user);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t st);

 private:
  void Loop();
  bool RunTasks() TANDEM_EXCLUDES(mu_);
  bool Stopping() TANDEM_EXCLUDES(mu_);
  StatusOr<Endpoint*> CurrentEndpoint(Peer* peer);
  // Reads one byte of a segment of the peer (or flushes, without one): the peer's answer proves
  // the handshake finished in both directions. Progresses the worker inline, bounded.
  Status WaitConnected(Endpoint* e, std::chrono::milliseconds timeout);
  // Gives up an endpoint that never connected: rkeys destroyed, the UCP endpoint left open.
  void Abandon(Endpoint* e);
  void IssueFlushes();
  void CompleteFlush(FlushGroup* group, ucs_status_t st);
  void Release(Op* op, ucs_status_t st);
  void Finish(Op* op, Status status);
  // Force-closes the endpoint; its requests end with their recorded status, or `reason`.
  void Reset(Endpoint* ep, const Status& reason);
  void OnClosed(Endpoint* ep);
  void ResetDeferred();
  void CheckDeadlines(Clock::time_point now);
  void Shutdown();

  const UcxTransportOptions options_;
  const std::string name_;  // for logs
  std::shared_ptr<spdlog::logger> log_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string worker_hex_;
  int worker_efd_ = -1;  // -1: this worker cannot sleep on an fd; poll in short naps
  int wake_fd_ = -1;     // eventfd: tasks are queued
  std::thread thread_;
  std::thread::id thread_id_;

  Mutex mu_;
  std::deque<std::function<void()>> tasks_ TANDEM_GUARDED_BY(mu_);
  bool stopping_ TANDEM_GUARDED_BY(mu_) = false;

  // Progress-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers_;  // by id
  std::unordered_map<std::string, uint64_t> peer_ids_;         // live peers by worker address
  // Every endpoint ever created: UCX callbacks carry raw pointers to them.
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<std::pair<Endpoint*, Status>> to_reset_;  // from UCX error callbacks
  std::map<uintptr_t, MappedRegion> regions_;           // by base address
  std::unordered_set<Op*> all_ops_;                     // UCX may still report these
  std::unordered_set<Op*> orphans_;  // reported after their endpoint closed; UCX should not
  std::unordered_set<FlushGroup*> flushes_;
  int closing_ = 0;  // endpoint closes in progress
  uint64_t next_id_ = 1;
  Clock::time_point next_deadline_check_{};
};

template <typename T>
StatusOr<T> UcxWorker::Call(std::function<StatusOr<T>()> fn) {
  if (std::this_thread::get_id() == thread_id_) return fn();
  auto promise = std::make_shared<std::promise<StatusOr<T>>>();
  std::future<StatusOr<T>> result = promise->get_future();
  if (!Post([promise, fn = std::move(fn)] { promise->set_value(fn()); })) {
    return Cancelled("ucx transport is stopped");
  }
  if (result.wait_for(std::chrono::milliseconds(options_.open_timeout_ms)) !=
      std::future_status::ready) {
    return DeadlineExceeded("ucx progress thread did not answer in time");
  }
  return result.get();
}

}  // namespace tandem::transfer::internal
