#include "transfer/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/logging.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;

constexpr const char* kAddressPrefix = "ucx1:";

std::string ToHex(const void* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

StatusOr<std::string> FromHex(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0) return InvalidArgument("bad hex field in ucx address");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("bad hex digit in ucx address");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

// The decoded form of SegmentDescriptor::ucx_address.
struct UcxAddress {
  std::string worker;   // raw ucp worker address bytes
  uint64_t base = 0;    // the segment's virtual address in the owner
  std::string rkey;     // raw packed rkey bytes
};

StatusOr<UcxAddress> ParseUcxAddress(const std::string& s) {
  const std::string_view prefix = kAddressPrefix;
  if (s.compare(0, prefix.size(), prefix) != 0) {
    return InvalidArgument("ucx address does not start with 'ucx1:'");
  }
  std::string_view rest = std::string_view(s).substr(prefix.size());
  const size_t a = rest.find(':');
  const size_t b = a == std::string_view::npos ? a : rest.find(':', a + 1);
  if (b == std::string_view::npos) return InvalidArgument("ucx address needs worker:base:rkey");
  UcxAddress out;
  TANDEM_ASSIGN_OR_RETURN(out.worker, FromHex(rest.substr(0, a)));
  const std::string_view base = rest.substr(a + 1, b - a - 1);
  if (base.empty() || base.size() > 16) return InvalidArgument("bad base address in ucx address");
  for (char c : base) {
    const int d = HexDigit(c);
    if (d < 0) return InvalidArgument("bad base address in ucx address");
    out.base = out.base * 16 + static_cast<uint64_t>(d);
  }
  TANDEM_ASSIGN_OR_RETURN(out.rkey, FromHex(rest.substr(b + 1)));
  return out;
}

Status UcsStatus(const std::string& what, ucs_status_t st) {
  const StatusCode code = (st == UCS_ERR_CANCELED) ? StatusCode::kCancelled
                          : (st == UCS_ERR_INVALID_PARAM) ? StatusCode::kInvalidArgument
                                                          : StatusCode::kUnavailable;
  return Status(code, what + ": " + ucs_status_string(st));
}

// UCX logs to stdout by default; route its messages to our "transfer" logger (stderr) instead.
// Its errors land at info: each one also comes back to us as a status we report ourselves, and
// some are expected (UCP_ERR_HANDLING_MODE_PEER refused by its shared-memory transports).
ucs_log_func_rc_t RouteUcxLog(const char* file, unsigned line, const char* function,
                              ucs_log_level_t level, const ucs_log_component_config_t* comp,
                              const char* format, va_list ap) {
  if (level > comp->log_level) return UCS_LOG_FUNC_RC_STOP;
  char message[1024];
  std::vsnprintf(message, sizeof(message), format, ap);
  auto log = GetLogger("transfer");
  if (level == UCS_LOG_LEVEL_FATAL) {
    log->error("ucx: {} ({}:{})", message, file, line);
  } else if (level <= UCS_LOG_LEVEL_ERROR) {
    log->info("ucx: {} ({}:{})", message, file, line);
  } else {
    log->debug("ucx: {} ({}:{})", message, file, line);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

void InstallUcxLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&RouteUcxLog); });
}

class UcxWorker;
struct Endpoint;

// One outstanding request. Owned by the worker (all_ops_); touched only on the progress thread.
struct Op {
  UcxWorker* worker = nullptr;
  CompletionCallback done;        // empty once called: the request's one terminal report
  Clock::time_point deadline;
  Endpoint* endpoint = nullptr;   // kept alive by the worker until shutdown
  int refs = 0;                   // UCX completions still to come (the request, the flush)
  Status status;                  // the report once UCX let go of the buffer (first error wins)
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
  std::unordered_set<Op*> ops;                   // unreported requests issued on it
  std::vector<Op*> unflushed;                    // writes issued since the last flush
};

// A segment's packed rkey and base address in its owner.
struct RemoteKey {
  std::string packed;
  uint64_t base = 0;
};

// A remote worker address; touched only on the progress thread.
struct Peer {
  uint64_t id = 0;
  std::string key;                                 // raw worker address
  bool failed = false;                             // the peer died: no new endpoint
  Status error;
  std::unordered_map<uint64_t, RemoteKey> packed;  // by rkey id (one per opened segment)
  std::shared_ptr<Endpoint> current;               // null until needed
};

// A region of this process mapped with ucp_mem_map.
struct MappedRegion {
  ucp_mem_h memh = nullptr;
  uint64_t size = 0;              // bytes
  std::string rkey_hex;           // empty for local-only regions
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
  void Stop();

  // Runs fn on the progress thread. False if the thread is stopping (fn is dropped).
  bool Post(std::function<void()> fn);
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
  bool RunTasks();
  bool Stopping();
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
  const std::string name_;        // for logs
  std::shared_ptr<spdlog::logger> log_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string worker_hex_;
  int worker_efd_ = -1;           // -1: this worker cannot sleep on an fd; poll in short naps
  int wake_fd_ = -1;              // eventfd: tasks are queued
  std::thread thread_;
  std::thread::id thread_id_;

  std::mutex mu_;                 // guards tasks_, stopping_
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;

  // Progress-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers_;   // by id
  std::unordered_map<std::string, uint64_t> peer_ids_;          // live peers by worker address
  // Every endpoint ever created: UCX callbacks carry raw pointers to them.
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<std::pair<Endpoint*, Status>> to_reset_;          // from UCX error callbacks
  std::map<uintptr_t, MappedRegion> regions_;                   // by base address
  std::unordered_set<Op*> all_ops_;                             // UCX may still report these
  std::unordered_set<Op*> orphans_;   // reported after their endpoint closed; UCX should not
  std::unordered_set<FlushGroup*> flushes_;
  int closing_ = 0;                                             // endpoint closes in progress
  uint64_t next_id_ = 1;
  Clock::time_point next_deadline_check_{};
};

UcxWorker::~UcxWorker() {
  Stop();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
  for (Op* op : all_ops_) delete op;
  for (Op* op : orphans_) delete op;
  for (FlushGroup* g : flushes_) delete g;
}

Status UcxWorker::Init() {
  InstallUcxLogHandler();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsStatus("ucp_config_read", st);
  if (!options_.tls.empty()) {
    st = ucp_config_modify(config, "TLS", options_.tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UcsStatus("UCX TLS '" + options_.tls + "'", st);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    context_ = nullptr;
    return UcsStatus("ucp_init", st);
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return UcsStatus("ucp_worker_create", st);
  }
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return UcsStatus("ucp_worker_get_address", st);
  worker_hex_ = ToHex(addr, addr_len);
  ucp_worker_release_address(worker_, addr);
  if (ucp_worker_get_efd(worker_, &worker_efd_) != UCS_OK) worker_efd_ = -1;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { Loop(); });
  thread_id_ = thread_.get_id();
  log_->debug("ucx[{}]: worker up, address {} bytes, wakeup fd {}", name_, addr_len, worker_efd_);
  return OkStatus();
}

void UcxWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  // Never self-join: the public API cannot reach Stop from the progress thread, but be safe.
  if (thread_.joinable() && std::this_thread::get_id() != thread_id_) thread_.join();
}

bool UcxWorker::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  return true;
}

bool UcxWorker::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

template <typename T>
StatusOr<T> UcxWorker::Call(std::function<StatusOr<T>()> fn) {
  if (std::this_thread::get_id() == thread_id_) return fn();
  auto promise = std::make_shared<std::promise<StatusOr<T>>>();
  std::future<StatusOr<T>> result = promise->get_future();
  if (!Post([promise, fn = std::move(fn)] { promise->set_value(fn()); })) {
    return Status(StatusCode::kCancelled, "ucx transport is stopped");
  }
  if (result.wait_for(std::chrono::milliseconds(options_.open_timeout_ms)) !=
      std::future_status::ready) {
    return Status(StatusCode::kDeadlineExceeded, "ucx progress thread did not answer in time");
  }
  return result.get();
}

bool UcxWorker::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
  return !tasks.empty();
}

void UcxWorker::Loop() {
  auto last_activity = Clock::now();
  const auto spin = std::chrono::microseconds(options_.progress_spin_us);
  while (true) {
    bool active = RunTasks();
    if (Stopping()) break;
    IssueFlushes();
    for (int rounds = 0; rounds < 1024 && ucp_worker_progress(worker_) != 0; ++rounds) {
      active = true;
    }
    ResetDeferred();
    const auto now = Clock::now();
    CheckDeadlines(now);
    if (active) {
      last_activity = now;
      continue;
    }
    // Requests in flight, or traffic a moment ago (a target serving emulated RMA): keep polling.
    if (!all_ops_.empty() || now - last_activity < spin) continue;
    // Sleep until UCX or a submitter has something for us. Bounded: deadlines are checked, and
    // UCX's shared-memory transports do not always signal the wakeup fd, so a recently busy
    // worker (a target serving emulated RMA) naps 1 ms at a time.
    const bool busy = !all_ops_.empty() || closing_ > 0 || now - last_activity < 1s;
    int timeout_ms = busy ? 1 : 50;
    if (worker_efd_ >= 0) {
      const ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) continue;
      if (st != UCS_OK) timeout_ms = 1;
    } else {
      timeout_ms = 1;
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {worker_efd_, POLLIN, 0}};
    poll(fds, worker_efd_ >= 0 ? 2 : 1, timeout_ms);
    uint64_t drained;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof(drained));
  }
  RunTasks();  // anything posted before stopping_ was set
  Shutdown();
}

StatusOr<std::string> UcxWorker::MapRegion(void* base, uint64_t size, bool publish) {
  UnmapRegion(base);  // registering the same base again replaces the old mapping
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = size;
  MappedRegion region;
  region.size = size;
  ucs_status_t st = ucp_mem_map(context_, &mp, &region.memh);
  if (st != UCS_OK) return UcsStatus("ucp_mem_map", st);
  if (publish) {
    void* packed = nullptr;
    size_t packed_len = 0;
    st = ucp_rkey_pack(context_, region.memh, &packed, &packed_len);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, region.memh);
      return UcsStatus("ucp_rkey_pack", st);
    }
    region.rkey_hex = ToHex(packed, packed_len);
    ucp_rkey_buffer_release(packed);
  }
  std::string rkey = region.rkey_hex;
  regions_[reinterpret_cast<uintptr_t>(base)] = std::move(region);
  return rkey;
}

void UcxWorker::UnmapRegion(void* base) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end()) return;
  ucp_mem_unmap(context_, it->second.memh);
  regions_.erase(it);
}

StatusOr<Endpoint*> UcxWorker::CurrentEndpoint(Peer* peer) {
  if (peer->current != nullptr) return peer->current.get();
  auto e = std::make_shared<Endpoint>();
  e->worker = this;
  e->peer = peer;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer->key.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxWorker::OnEndpointError;
  ep.err_handler.arg = e.get();
  ucs_status_t st = ucp_ep_create(worker_, &ep, &e->ep);
  if (st == UCS_ERR_UNREACHABLE) {
    // UCX's shared-memory transports cannot detect peer failure; without it, a dead peer's
    // requests end at their deadlines instead of at the endpoint error.
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_, &ep, &e->ep);
    if (st == UCS_OK) log_->debug("ucx[{}]: peer reachable without failure detection", name_);
  }
  if (st != UCS_OK) return UcsStatus("ucp_ep_create", st);
  endpoints_.push_back(e);
  for (auto& [id, key] : peer->packed) {
    ucp_rkey_h rkey = nullptr;
    st = ucp_ep_rkey_unpack(e->ep, key.packed.data(), &rkey);
    if (st != UCS_OK) {
      Abandon(e.get());
      return UcsStatus("ucp_ep_rkey_unpack", st);
    }
    e->rkeys[id] = rkey;
  }
  // Finish the connection handshake, both ways, before any use: UCX 1.13 aborts (an assertion
  // in its pending-queue purge, removed upstream later) when an endpoint is closed or its worker
  // destroyed while a handshake message is still queued. An endpoint that does not connect in
  // time is abandoned, never closed.
  Status connected = WaitConnected(e.get(), std::chrono::milliseconds(
                                                std::min(options_.open_timeout_ms / 2, 2000)));
  if (!connected.ok()) {
    Abandon(e.get());
    return connected;
  }
  peer->current = e;
  return e.get();
}

void UcxWorker::Abandon(Endpoint* e) {
  e->closing = true;
  for (auto& [id, rkey] : e->rkeys) ucp_rkey_destroy(rkey);
  e->rkeys.clear();
}

StatusOr<std::pair<uint64_t, uint64_t>> UcxWorker::Connect(const UcxAddress& addr) {
  Peer* peer = nullptr;
  auto known = peer_ids_.find(addr.worker);
  if (known != peer_ids_.end()) peer = peers_.at(known->second).get();
  if (peer == nullptr) {
    auto p = std::make_unique<Peer>();
    p->id = next_id_++;
    p->key = addr.worker;
    peer = p.get();
    peers_[p->id] = std::move(p);
    peer_ids_[peer->key] = peer->id;
  }
  const uint64_t rkey_id = next_id_++;
  peer->packed[rkey_id] = RemoteKey{addr.rkey, addr.base};
  if (peer->current != nullptr) {
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(peer->current->ep, addr.rkey.data(), &rkey);
    if (st != UCS_OK) {
      peer->packed.erase(rkey_id);
      return UcsStatus("ucp_ep_rkey_unpack", st);
    }
    peer->current->rkeys[rkey_id] = rkey;
  } else {
    auto e = CurrentEndpoint(peer);  // unpacks every rkey of the peer, this one included
    if (!e.ok()) {
      peer->packed.erase(rkey_id);
      return e.status();
    }
  }
  return std::make_pair(peer->id, rkey_id);
}

void UcxWorker::ReleaseRkey(uint64_t peer_id, uint64_t rkey_id) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
  peer->packed.erase(rkey_id);
  if (peer->current != nullptr) {
    auto r = peer->current->rkeys.find(rkey_id);
    if (r != peer->current->rkeys.end()) {
      ucp_rkey_destroy(r->second);
      peer->current->rkeys.erase(r);
    }
  }
  if (peer->packed.empty() && peer->current == nullptr) {  // nothing refers to the peer now
    if (peer_ids_.count(peer->key) && peer_ids_[peer->key] == peer_id) peer_ids_.erase(peer->key);
    peers_.erase(it);
  }
}

void UcxWorker::StartOp(bool write, uint64_t peer_id, uint64_t rkey_id, uint64_t remote_addr,
                        void* local, uint64_t length, Clock::time_point deadline,
                        CompletionCallback done) {
  if (Stopping()) {
    done(Status(StatusCode::kCancelled, "ucx transport is shutting down"));
    return;
  }
  auto it = peers_.find(peer_id);
  if (it == peers_.end() || it->second->failed) {
    done(Status(StatusCode::kUnavailable,
                it == peers_.end() ? std::string("ucx peer is gone") : it->second->error.message()));
    return;
  }
  if (Clock::now() >= deadline) {
    done(Status(StatusCode::kDeadlineExceeded, "ucx request reached its deadline before start"));
    return;
  }
  auto endpoint = CurrentEndpoint(it->second.get());
  if (!endpoint.ok()) {
    done(endpoint.status());
    return;
  }
  Endpoint* e = *endpoint;
  auto rk = e->rkeys.find(rkey_id);
  if (rk == e->rkeys.end()) {
    done(Status(StatusCode::kFailedPrecondition, "ucx segment was closed"));
    return;
  }
  auto* op = new Op();
  op->worker = this;
  op->done = std::move(done);
  op->deadline = deadline;
  op->endpoint = e;
  all_ops_.insert(op);
  e->ops.insert(op);

  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxWorker::OnRequestDone;
  p.user_data = op;
  // Pass the local memory handle when the buffer lies in a mapped region (zero copy without a
  // registration-cache lookup in UCX).
  auto reg = regions_.upper_bound(reinterpret_cast<uintptr_t>(local));
  if (reg != regions_.begin()) {
    --reg;
    const uintptr_t lo = reg->first, at = reinterpret_cast<uintptr_t>(local);
    if (at >= lo && at - lo <= reg->second.size && length <= reg->second.size - (at - lo)) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = reg->second.memh;
    }
  }
  const ucs_status_ptr_t sp = write
      ? ucp_put_nbx(e->ep, local, length, remote_addr, rk->second, &p)
      : ucp_get_nbx(e->ep, local, length, remote_addr, rk->second, &p);
  if (UCS_PTR_IS_ERR(sp)) {
    e->ops.erase(op);
    all_ops_.erase(op);
    CompletionCallback report = std::move(op->done);
    delete op;
    report(UcsStatus(write ? "ucp_put_nbx" : "ucp_get_nbx", UCS_PTR_STATUS(sp)));
    return;
  }
  ++op->refs;                     // held by this function until the end
  if (sp != nullptr) ++op->refs;  // OnRequestDone will come
  if (write) {
    ++op->refs;                   // the flush that makes the put remotely complete
    e->unflushed.push_back(op);
  }
  Release(op, UCS_OK);
}

// A flush completes once the endpoint's handshake and everything issued on it completed.
struct ConnectWait {
  bool done = false;
  ucs_status_t status = UCS_OK;
  char byte = 0;  // destination of the probing read
};

void OnConnectFlush(void* request, ucs_status_t st, void* user) {
  auto* wait = static_cast<ConnectWait*>(user);
  wait->done = true;
  wait->status = st;
  ucp_request_free(request);
}

Status UcxWorker::WaitConnected(Endpoint* e, std::chrono::milliseconds timeout) {
  auto* wait = new ConnectWait();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnConnectFlush;
  p.user_data = wait;
  ucs_status_ptr_t sp;
  if (!e->rkeys.empty()) {
    const auto& [id, rkey] = *e->rkeys.begin();
    sp = ucp_get_nbx(e->ep, &wait->byte, 1, e->peer->packed.at(id).base, rkey, &p);
  } else {
    sp = ucp_ep_flush_nbx(e->ep, &p);
  }
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) {
    delete wait;
    return sp == nullptr ? OkStatus() : UcsStatus("ucx connect", UCS_PTR_STATUS(sp));
  }
  const auto until = Clock::now() + timeout;
  while (!wait->done && Clock::now() < until) {
    if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
  }
  if (!wait->done) {
    // `wait` stays allocated: UCX may still complete the flush.
    return Status(StatusCode::kUnavailable, "ucx peer did not complete the connection in time");
  }
  const ucs_status_t st = wait->status;
  delete wait;
  return st == UCS_OK ? OkStatus() : UcsStatus("ucx connect", st);
}

void UcxWorker::IssueFlushes() {
  for (auto& [id, peer] : peers_) {
    Endpoint* e = peer->current.get();
    if (e == nullptr || e->unflushed.empty()) continue;
    auto* group = new FlushGroup();
    group->worker = this;
    group->ops.swap(e->unflushed);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxWorker::OnFlushDone;
    p.user_data = group;
    const ucs_status_ptr_t sp = ucp_ep_flush_nbx(e->ep, &p);
    if (sp == nullptr) {
      CompleteFlush(group, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
      CompleteFlush(group, UCS_PTR_STATUS(sp));
    } else {
      flushes_.insert(group);
    }
  }
}

void UcxWorker::CompleteFlush(FlushGroup* group, ucs_status_t st) {
  flushes_.erase(group);
  for (Op* op : group->ops) Release(op, st);
  delete group;
}

void UcxWorker::Release(Op* op, ucs_status_t st) {
  if (st != UCS_OK && op->status.ok()) op->status = UcsStatus("ucx transfer", st);
  if (--op->refs > 0) return;
  Finish(op, op->status);
  all_ops_.erase(op);
  orphans_.erase(op);
  delete op;
}

void UcxWorker::Finish(Op* op, Status status) {
  if (!op->done) return;
  CompletionCallback done = std::move(op->done);
  op->done = nullptr;
  op->endpoint->ops.erase(op);
  done(std::move(status));
}

void UcxWorker::OnRequestDone(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<Op*>(user);
  ucp_request_free(request);
  op->worker->Release(op, st);
}

void UcxWorker::OnFlushDone(void* request, ucs_status_t st, void* user) {
  auto* group = static_cast<FlushGroup*>(user);
  ucp_request_free(request);
  group->worker->CompleteFlush(group, st);
}

void UcxWorker::OnCloseDone(void* request, ucs_status_t st, void* user) {
  auto* e = static_cast<Endpoint*>(user);
  ucp_request_free(request);
  e->worker->OnClosed(e);
}

void UcxWorker::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t st) {
  auto* e = static_cast<Endpoint*>(arg);
  if (e->closing) return;  // being closed anyway; its peer may be gone
  Status error = UcsStatus("ucx peer unreachable", st);
  e->peer->failed = true;  // no new endpoint to a dead peer; reopen the segment to retry
  e->peer->error = error;
  e->worker->to_reset_.emplace_back(e, error);  // ucp_ep_close_nbx may not run in here
}

void UcxWorker::ResetDeferred() {
  if (to_reset_.empty()) return;
  std::vector<std::pair<Endpoint*, Status>> pending;
  pending.swap(to_reset_);
  for (auto& [e, error] : pending) {
    if (e->closing) continue;
    log_->warn("ucx[{}]: endpoint failed: {}", name_, error.message());
    Peer* peer = e->peer;
    Reset(e, error);
    if (peer->failed && peer_ids_.count(peer->key) && peer_ids_[peer->key] == peer->id) {
      peer_ids_.erase(peer->key);  // a later Open connects afresh
    }
  }
}

void UcxWorker::Reset(Endpoint* e, const Status& reason) {
  if (e->closing) return;
  e->closing = true;
  if (e->peer->current.get() == e) e->peer->current = nullptr;
  for (Op* op : e->ops) {
    if (op->status.ok()) op->status = reason;
  }
  std::vector<Op*> unflushed;
  unflushed.swap(e->unflushed);
  for (Op* op : unflushed) Release(op, UCS_ERR_CANCELED);  // their flush will never be issued
  for (auto& [id, rkey] : e->rkeys) ucp_rkey_destroy(rkey);
  e->rkeys.clear();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // cancels what is in flight; never waits for the peer
  p.cb.send = &UcxWorker::OnCloseDone;
  p.user_data = e;
  ++closing_;
  const ucs_status_ptr_t sp = ucp_ep_close_nbx(e->ep, &p);
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) OnClosed(e);
}

void UcxWorker::OnClosed(Endpoint* e) {
  --closing_;
  e->ep = nullptr;
  // UCX is done with every request of the endpoint: report those whose completions it dropped.
  std::vector<Op*> ops(e->ops.begin(), e->ops.end());
  for (Op* op : ops) {
    Finish(op, op->status.ok() ? Status(StatusCode::kCancelled, "ucx endpoint closed")
                               : op->status);
    all_ops_.erase(op);
    orphans_.insert(op);
  }
}

void UcxWorker::CheckDeadlines(Clock::time_point now) {
  if (now < next_deadline_check_ || all_ops_.empty()) return;
  next_deadline_check_ = now + std::chrono::milliseconds(1);
  std::vector<Endpoint*> late;
  for (Op* op : all_ops_) {
    if (op->done && op->deadline <= now && !op->endpoint->closing) {
      if (op->status.ok()) {
        op->status = Status(StatusCode::kDeadlineExceeded, "ucx request passed its deadline");
      }
      late.push_back(op->endpoint);
    }
  }
  // RMA cannot be cancelled one request at a time: closing the endpoint is what guarantees UCX
  // lets go of the buffers. Its other requests fail too; the next request opens a new endpoint.
  for (Endpoint* e : late) {
    Reset(e, Status(StatusCode::kUnavailable,
                    "ucx endpoint reset: another request on it passed its deadline"));
  }
}

void UcxWorker::Shutdown() {
  for (auto& [id, peer] : peers_) {
    if (peer->current != nullptr) {
      Reset(peer->current.get(), Status(StatusCode::kCancelled, "ucx transport shut down"));
    }
  }
  const auto until = Clock::now() + std::chrono::seconds(2);
  while ((closing_ > 0 || !flushes_.empty()) && Clock::now() < until) {
    ucp_worker_progress(worker_);
  }
  std::vector<Op*> ops(all_ops_.begin(), all_ops_.end());
  for (Op* op : ops) Finish(op, Status(StatusCode::kCancelled, "ucx transport shut down"));
  peers_.clear();
  peer_ids_.clear();
  for (auto& [base, region] : regions_) ucp_mem_unmap(context_, region.memh);
  regions_.clear();
}

class UcxRemoteSegment : public RemoteSegment {
 public:
  UcxRemoteSegment(SegmentDescriptor desc, std::shared_ptr<UcxWorker> worker, uint64_t peer_id,
                   uint64_t rkey_id, uint64_t base)
      : desc_(std::move(desc)), worker_(std::move(worker)), peer_id_(peer_id), rkey_id_(rkey_id),
        base_(base) {}
  ~UcxRemoteSegment() override {
    worker_->Post([w = worker_.get(), p = peer_id_, r = rkey_id_] { w->ReleaseRkey(p, r); });
  }
  const SegmentDescriptor& descriptor() const override { return desc_; }
  uint64_t peer_id() const { return peer_id_; }
  uint64_t rkey_id() const { return rkey_id_; }
  uint64_t base() const { return base_; }

 private:
  SegmentDescriptor desc_;
  std::shared_ptr<UcxWorker> worker_;
  uint64_t peer_id_, rkey_id_;
  uint64_t base_;  // the segment's address in its owner
};

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxWorker> worker) : worker_(std::move(worker)) {}
  ~UcxTransport() override { worker_->Stop(); }

  Protocol protocol() const override { return Protocol::kUcx; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.zero_copy = true;
    c.slice_bytes = uint64_t{64} << 20;  // UCX pipelines large messages itself
    return c;
  }

  Status OnRegister(const LocalRegion& region, SegmentDescriptor* desc) override {
    if (region.base == nullptr || region.size == 0) {
      return InvalidArgument("ucx: cannot register an empty region");
    }
    const bool publish = !region.segment_name.empty() && desc != nullptr;
    UcxWorker* w = worker_.get();
    void* base = region.base;
    const uint64_t size = region.size;
    TANDEM_ASSIGN_OR_RETURN(std::string rkey, worker_->Call<std::string>(
        [w, base, size, publish] { return w->MapRegion(base, size, publish); }));
    if (publish) {
      char base_hex[32];
      std::snprintf(base_hex, sizeof(base_hex), "%llx",
                    static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(base)));
      desc->ucx_address =
          std::string(kAddressPrefix) + worker_->worker_hex() + ":" + base_hex + ":" + rkey;
    }
    return OkStatus();
  }

  void OnUnregister(const LocalRegion& region) override {
    UcxWorker* w = worker_.get();
    void* base = region.base;
    auto done = worker_->Call<bool>([w, base]() -> StatusOr<bool> {
      w->UnmapRegion(base);
      return true;
    });
    if (!done.ok()) {
      GetLogger("transfer")->warn("ucx: unregister: {}", done.status().ToString());
    }
  }

  bool CanReach(const SegmentDescriptor& remote) const override {
    return !remote.ucx_address.empty() && ParseUcxAddress(remote.ucx_address).ok();
  }

  StatusOr<std::unique_ptr<RemoteSegment>> Open(const SegmentDescriptor& remote) override {
    if (remote.ucx_address.empty()) {
      return InvalidArgument("segment '" + remote.name + "' publishes no ucx address");
    }
    auto parsed = ParseUcxAddress(remote.ucx_address);
    if (!parsed.ok()) return parsed.status().WithContext("segment '" + remote.name + "'");
    UcxWorker* w = worker_.get();
    auto addr = std::make_shared<UcxAddress>(std::move(*parsed));
    TANDEM_ASSIGN_OR_RETURN(auto ids, (worker_->Call<std::pair<uint64_t, uint64_t>>(
        [w, addr] { return w->Connect(*addr); })));
    return std::unique_ptr<RemoteSegment>(
        new UcxRemoteSegment(remote, worker_, ids.first, ids.second, addr->base));
  }

  void Submit(RemoteSegment& segment, const TransferRequest& request, Clock::time_point deadline,
              CompletionCallback done) override {
    auto* seg = dynamic_cast<UcxRemoteSegment*>(&segment);
    if (seg == nullptr) {
      done(InvalidArgument("segment was not opened by the ucx transport"));
      return;
    }
    const uint64_t size = seg->descriptor().size;
    if (request.length == 0 || request.local == nullptr || request.remote_offset > size ||
        request.length > size - request.remote_offset) {
      done(OutOfRange("ucx request outside the segment or empty"));
      return;
    }
    UcxWorker* w = worker_.get();
    const bool write = request.op == OpCode::kWrite;
    const uint64_t peer = seg->peer_id(), rkey = seg->rkey_id();
    const uint64_t remote = seg->base() + request.remote_offset;
    void* local = request.local;
    const uint64_t length = request.length;
    // The callback is copied into the task only if the task is queued; a refused Post leaves
    // `done` with us to report the failure.
    auto shared_done = std::make_shared<CompletionCallback>(std::move(done));
    const bool queued = worker_->Post([w, write, peer, rkey, remote, local, length, deadline,
                                       shared_done] {
      w->StartOp(write, peer, rkey, remote, local, length, deadline, std::move(*shared_done));
    });
    if (!queued) (*shared_done)(Status(StatusCode::kCancelled, "ucx transport is stopped"));
  }

 private:
  std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> MakeUcxTransport(TransportHost* host,
                                                      const UcxTransportOptions& options) {
  if (options.progress_spin_us < 0 || options.open_timeout_ms <= 0) {
    return InvalidArgument("ucx: progress_spin_us must be >= 0 and open_timeout_ms > 0");
  }
  std::string name = host != nullptr ? host->local_name() : std::string("ucx");
  auto worker = std::make_shared<UcxWorker>(options, std::move(name));
  Status st = worker->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<Transport>(new UcxTransport(std::move(worker)));
}

}  // namespace tandem::transfer
