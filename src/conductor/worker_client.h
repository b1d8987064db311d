// The conductor's client of one worker's control protocol (cluster/protocol.h): stats, prefill,
// the streamed decode call and cancel, each bounded by a deadline. Connections of the
// request/response calls are pooled (kept alive and reused); a streamed decode call holds its
// own connection for the stream's life.
//
// Thread-safety: thread-safe; any number of calls may run at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "common/mutex.h"
#include "common/status.h"

namespace httplib {
class Client;
}

namespace tandem::conductor {

using Clock = std::chrono::steady_clock;

class WorkerClient {
 public:
  WorkerClient(std::string host, int port);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

  // GET /stats. Unavailable if the worker does not answer by `deadline`.
  StatusOr<cluster::WorkerStats> Stats(Clock::time_point deadline);

  // POST /v1/prefill. Unavailable when the connection fails (then *connection_failed, if
  // given, is set: the worker itself may be gone); the worker's error otherwise.
  StatusOr<cluster::PrefillResult> Prefill(const cluster::PrefillCall& call,
                                           Clock::time_point deadline,
                                           bool* connection_failed = nullptr);

  // POST /v1/role: the worker takes the new role (elastic pools). Unavailable when it does not
  // answer; its error otherwise.
  StatusOr<cluster::RoleChangeResult> ChangeRole(const cluster::RoleChange& change,
                                                 Clock::time_point deadline);

  // POST /v1/threads: the worker's engine computes on that many threads from its next step.
  StatusOr<cluster::ThreadsChangeResult> ChangeThreads(const cluster::ThreadsChange& change,
                                                       Clock::time_point deadline);

  // POST /v1/cancel (best effort, bounded by `deadline`).
  void Cancel(const std::string& id, Clock::time_point deadline);

  // POST /v1/decode: `on_event` sees each event of the stream in order and returns false to
  // stop reading (the connection is then closed, which the worker takes as cancel). Returns OK
  // when the stream was read to its end or stopped by on_event; the worker's error when it
  // answered with one before streaming (e.g. ResourceExhausted: no KV room now); Unavailable
  // when the connection broke; a malformed line is InvalidArgument.
  // *connection_failed as for Prefill.
  Status Decode(const cluster::DecodeCall& call, Clock::time_point deadline,
                const std::function<bool(const cluster::DecodeEvent&)>& on_event,
                bool* connection_failed = nullptr);

 private:
  // "worker host:port", for errors.
  std::string Peer() const;
  // POSTs a control call whose answer is one JSON body: the body on 200; Unavailable when the
  // worker does not answer; its error otherwise.
  StatusOr<std::string> PostControl(const char* path, const std::string& body,
                                    Clock::time_point deadline);
  std::unique_ptr<httplib::Client> Take(Clock::time_point deadline) TANDEM_EXCLUDES(mu_);
  void Give(std::unique_ptr<httplib::Client> c) TANDEM_EXCLUDES(mu_);
  std::unique_ptr<httplib::Client> NewClient(Clock::time_point deadline, bool keep_alive) const;

  const std::string host_;
  const int port_;
  Mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> idle_ TANDEM_GUARDED_BY(mu_);
};

}  // namespace tandem::conductor
