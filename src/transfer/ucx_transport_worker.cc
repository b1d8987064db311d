// UcxWorker: the UCP context and worker, the progress thread and its task queue, memory
// region mapping, and the request path (puts and gets, flushes, completions, deadlines and
// shutdown). Endpoints and connections are in ucx_transport_endpoint.cc.
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/ucx_transport_internal.h"

namespace tandem::transfer::internal {
namespace {

using namespace std::chrono_literals;

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

}  // namespace

Status UcsStatus(const std::string& what, ucs_status_t st) {
  const StatusCode code = (st == UCS_ERR_CANCELED)        ? StatusCode::kCancelled
                          : (st == UCS_ERR_INVALID_PARAM) ? StatusCode::kInvalidArgument
                                                          : StatusCode::kUnavailable;
  return Status(code, what + ": " + ucs_status_string(st));
}

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
    MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  return true;
}

bool UcxWorker::Stopping() {
  MutexLock lock(&mu_);
  return stopping_;
}

bool UcxWorker::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    MutexLock lock(&mu_);
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

void UcxWorker::StartOp(bool write, uint64_t peer_id, uint64_t rkey_id, uint64_t remote_addr,
                        void* local, uint64_t length, Clock::time_point deadline,
                        CompletionCallback done) {
  if (Stopping()) {
    done(Cancelled("ucx transport is shutting down"));
    return;
  }
  auto it = peers_.find(peer_id);
  if (it == peers_.end() || it->second->failed) {
    done(Unavailable(it == peers_.end() ? std::string("ucx peer is gone")
                                        : it->second->error.message()));
    return;
  }
  if (Clock::now() >= deadline) {
    done(DeadlineExceeded("ucx request reached its deadline before start"));
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
    done(FailedPrecondition("ucx segment was closed"));
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
    ++op->refs;  // the flush that makes the put remotely complete
    e->unflushed.push_back(op);
  }
  Release(op, UCS_OK);
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

void UcxWorker::CheckDeadlines(Clock::time_point now) {
  if (now < next_deadline_check_ || all_ops_.empty()) return;
  next_deadline_check_ = now + std::chrono::milliseconds(1);
  std::vector<Endpoint*> late;
  for (Op* op : all_ops_) {
    if (op->done && op->deadline <= now && !op->endpoint->closing) {
      if (op->status.ok()) {
        op->status = DeadlineExceeded("ucx request passed its deadline");
      }
      late.push_back(op->endpoint);
    }
  }
  // RMA cannot be cancelled one request at a time: closing the endpoint is what guarantees UCX
  // lets go of the buffers. Its other requests fail too; the next request opens a new endpoint.
  for (Endpoint* e : late) {
    Reset(e, Unavailable("ucx endpoint reset: another request on it passed its deadline"));
  }
}

void UcxWorker::Shutdown() {
  for (auto& [id, peer] : peers_) {
    if (peer->current != nullptr) {
      Reset(peer->current.get(), Cancelled("ucx transport shut down"));
    }
  }
  const auto until = Clock::now() + std::chrono::seconds(2);
  while ((closing_ > 0 || !flushes_.empty()) && Clock::now() < until) {
    ucp_worker_progress(worker_);
  }
  std::vector<Op*> ops(all_ops_.begin(), all_ops_.end());
  for (Op* op : ops) Finish(op, Cancelled("ucx transport shut down"));
  peers_.clear();
  peer_ids_.clear();
  for (auto& [base, region] : regions_) ucp_mem_unmap(context_, region.memh);
  regions_.clear();
}

}  // namespace tandem::transfer::internal
