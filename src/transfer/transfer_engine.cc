// The transfer engine core: registration and publication of memory, opened segments, batch
// validation, per-request state machines, deadlines and notifications. Data moves in the
// transports (shm_transport.cc, tcp_transport*.cc).
#include "transfer/transfer_engine.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "transfer/shm_transport.h"
#include "transfer/tcp_transport.h"
#include "transfer/transfer_util.h"
#include "transfer/transport.h"
#ifdef TANDEM_WITH_UCX
#include "transfer/ucx_transport.h"
#endif

namespace tandem::transfer {
namespace {

const char kSegmentPrefix[] = "tandem/segments/";
constexpr size_t kMaxSegmentName = 200;         // bytes
constexpr uint64_t kMaxNotificationBytes = 64 << 10;
constexpr auto kUnregisterWait = std::chrono::seconds(5);

// Internal request state between kPending and a terminal state: the winner of the CAS out of
// kPending writes the error, then publishes the terminal state.
constexpr int kFinishing = 100;

// Worker threads for copies (shm). FIFO; Stop runs what is still queued, and later calls run
// the function inline, so every function runs exactly once.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() { Stop(); }

  bool Run(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        queue_.push_back(std::move(fn));
        cv_.notify_one();
        return true;
      }
    }
    fn();
    return false;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

// Registered local memory; a published segment when info.segment_name is set.
struct Region {
  LocalRegion info;
  std::atomic<bool> retiring{false};
  SharedMemory shm;  // AllocateSegment only; unmapped when the last user lets go
  std::string metadata_key;  // published segments only
};

struct OpenedSegment {
  SegmentDescriptor desc;
  Protocol protocol = Protocol::kTcp;
  Transport* transport = nullptr;
  std::shared_ptr<RemoteSegment> remote;
  std::mutex notify_mu;
  std::shared_ptr<RemoteSegment> notify_remote;  // over TCP; opened on the first notification
};

struct RequestState {
  std::atomic<int> state{static_cast<int>(TransferState::kPending)};
  std::atomic<uint32_t> slices_left{0};
  std::mutex error_mu;
  Status slice_error;  // first failing slice; guarded by error_mu
  Status error;        // final; written before the terminal state is published
  OpCode op = OpCode::kWrite;
  uint64_t length = 0;
};

struct Batch {
  BatchId id = 0;
  Clock::time_point deadline;
  std::string notification;
  size_t size = 0;
  std::unique_ptr<RequestState[]> requests;
  std::atomic<size_t> pending{0};         // requests not yet terminal
  std::atomic<size_t> not_completed{0};   // requests that ended failed or timed out
  std::shared_ptr<OpenedSegment> target;  // for the notification
  std::atomic<bool> notify_started{false};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool done = false;    // guarded by mu: requests terminal and notification settled
  Status notify_error;  // guarded by mu
};

// t + kReapSlack without overflowing for far-future deadlines (e.g. time_point::max()).
Clock::time_point ReapTime(Clock::time_point t) {
  return t > Clock::time_point::max() - kReapSlack ? Clock::time_point::max() : t + kReapSlack;
}

TransferState StateFor(const Status& st) {
  if (st.ok()) return TransferState::kCompleted;
  if (st.code() == StatusCode::kDeadlineExceeded) return TransferState::kTimedOut;
  return TransferState::kFailed;
}

bool ValidSegmentName(const std::string& name) {
  if (name.empty() || name.size() > kMaxSegmentName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c > ' ' && c < 127;  // printable ASCII, no spaces
  });
}

class TransferEngineImpl final : public TransferEngine, public TransportHost {
 public:
  explicit TransferEngineImpl(TransferEngineOptions options)
      : options_(std::move(options)), workers_(options_.worker_threads) {}

  ~TransferEngineImpl() override;

  Status Init();

  // TransferEngine.
  StatusOr<void*> AllocateSegment(const std::string& name, uint64_t size) override;
  Status RegisterSegment(const std::string& name, void* base, uint64_t size) override;
  Status UnregisterSegment(const std::string& name) override;
  Status RegisterLocalMemory(void* base, uint64_t size) override;
  Status UnregisterLocalMemory(void* base) override;
  StatusOr<SegmentHandle> OpenSegment(const std::string& name) override;
  Status CloseSegment(SegmentHandle handle) override;
  StatusOr<Protocol> SegmentProtocol(SegmentHandle handle) const override;
  StatusOr<BatchId> SubmitBatch(std::span<const TransferRequest> requests,
                                Clock::time_point deadline, std::string notification) override;
  RequestStatus GetRequestStatus(BatchId batch, size_t index) const override;
  BatchStatus GetBatchStatus(BatchId batch) const override;
  BatchStatus WaitBatch(BatchId batch) override;
  Status FreeBatch(BatchId batch) override;
  void SetNotificationHandler(std::function<void(const Notification&)> handler) override;
  TransferCounters Counters() const override;
  const std::string& local_name() const override { return options_.local_name; }

  // TransportHost.
  bool RunOnWorker(std::function<void()> fn) override { return workers_.Run(std::move(fn)); }
  std::shared_ptr<const LocalRegion> FindSegment(const std::string& name) override;
  void DeliverNotification(const Notification& notification) override;
  void AddBytesServed(uint64_t bytes) override {
    bytes_served_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  Status Publish(const std::string& name, std::shared_ptr<Region> region);
  // Whether [p, p + len) lies inside registered memory; the region if so. Caller holds mem_mu_.
  std::shared_ptr<Region> FindLocal(const void* p, uint64_t len) const;
  bool Overlaps(const void* p, uint64_t len) const;
  std::shared_ptr<Batch> LookupBatch(BatchId id) const;
  Transport* TransportFor(Protocol p) const;

  void OnSliceDone(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  // Moves request `index` from kPending to its terminal state; false if it was not pending.
  bool Finish(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  void OnRequestsDone(const std::shared_ptr<Batch>& batch);
  void SettleBatch(const std::shared_ptr<Batch>& batch, Status notify_error);
  // Forces every request still pending at deadline + kReapSlack to kTimedOut (and an unsettled
  // notification to a failure). Safe to race with late completions.
  void Reap(const std::shared_ptr<Batch>& batch);
  void ReaperLoop();
  BatchStatus Summarize(const Batch& batch) const;

  const TransferEngineOptions options_;
  std::string host_id_;
  WorkerPool workers_;
  // Transports, destroyed before the registries they call back into.
  std::vector<std::unique_ptr<Transport>> transports_;
  TcpTransport* tcp_ = nullptr;  // also in transports_; carries notifications

  mutable std::shared_mutex mem_mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;            // by base; guarded by mem_mu_
  std::map<std::string, std::shared_ptr<Region>> segments_;         // by name; guarded by mem_mu_

  mutable std::shared_mutex open_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenedSegment>> opened_;  // guarded by open_mu_
  uint64_t next_handle_ = 1;                                          // guarded by open_mu_

  mutable std::mutex batch_mu_;
  std::condition_variable reaper_cv_;
  std::unordered_map<BatchId, std::shared_ptr<Batch>> batches_;  // guarded by batch_mu_
  BatchId next_batch_ = 1;                                       // guarded by batch_mu_
  bool stopping_ = false;                                        // guarded by batch_mu_
  std::atomic<bool> shutting_down_{false};
  std::thread reaper_;

  std::mutex handler_mu_;
  std::function<void(const Notification&)> handler_;  // guarded by handler_mu_

  std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0}, requests_completed_{0},
      requests_failed_{0}, requests_timed_out_{0}, requests_refused_{0}, bytes_served_{0},
      notifications_sent_{0}, notifications_received_{0};
};

Status TransferEngineImpl::Init() {
  TANDEM_ASSIGN_OR_RETURN(host_id_, ReadHostId());
  auto shm = std::make_unique<ShmTransport>(this, host_id_);
  TcpTransportOptions tcp_options;
  tcp_options.listen_host = options_.tcp_listen_host;
  tcp_options.listen_port = options_.tcp_listen_port;
  tcp_options.advertise_host = options_.tcp_advertise_host;
  tcp_options.connections_per_peer = options_.tcp_connections_per_peer;
  auto tcp = TcpTransport::Create(this, tcp_options);
  if (!tcp.ok()) return tcp.status().WithContext("transfer engine '" + options_.local_name + "'");
  tcp_ = tcp->get();
  transports_.push_back(std::move(shm));
  transports_.push_back(std::move(*tcp));
#ifdef TANDEM_WITH_UCX
  if (std::find(options_.protocols.begin(), options_.protocols.end(), Protocol::kUcx) !=
      options_.protocols.end()) {
    auto ucx = MakeUcxTransport(this, UcxTransportOptions{});
    if (ucx.ok()) {
      transports_.push_back(std::move(*ucx));
    } else {
      GetLogger("transfer")->warn("transfer engine '{}': UCX unavailable: {}", options_.local_name,
                                  ucx.status().ToString());
    }
  }
#endif
  for (Protocol p : options_.protocols) {
    if (TransportFor(p) == nullptr) {
      GetLogger("transfer")->warn("transfer engine '{}': protocol {} not built in; ignored",
                                  options_.local_name, ProtocolName(p));
    }
  }
  reaper_ = std::thread([this] { ReaperLoop(); });
  GetLogger("transfer")->info("transfer engine '{}' listening on {}", options_.local_name,
                              tcp_->endpoint());
  return OkStatus();
}

TransferEngineImpl::~TransferEngineImpl() {
  shutting_down_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  {
    std::unique_lock<std::shared_mutex> lock(open_mu_);
    opened_.clear();  // requests in flight keep their segments until they end
  }
  // Shm first (queued copies then end as cancelled while the workers drain), then TCP, whose
  // destructor fails what is in flight and joins its threads.
  if (!transports_.empty()) transports_.front().reset();
  workers_.Stop();
  for (auto& t : transports_) t.reset();
  tcp_ = nullptr;
  // Every request is terminal now; wake waiters (a notification never sent settles here).
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    for (auto& [id, batch] : batches_) {
      SettleBatch(batch, Cancelled("transfer engine shut down"));
    }
  }
  std::map<std::string, std::shared_ptr<Region>> segments;
  {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    segments.swap(segments_);
    regions_.clear();
  }
  for (auto& [name, region] : segments) {
    Status st = options_.metadata->Delete(region->metadata_key);
    if (!st.ok()) {
      GetLogger("transfer")->warn("unpublishing segment '{}': {}", name, st.ToString());
    }
  }
}

Transport* TransferEngineImpl::TransportFor(Protocol p) const {
  for (const auto& t : transports_) {
    if (t != nullptr && t->protocol() == p) return t.get();
  }
  return nullptr;
}

// ---- Registration --------------------------------------------------------------------------

bool TransferEngineImpl::Overlaps(const void* p, uint64_t len) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + len;
  auto it = regions_.lower_bound(end);  // first region starting at or after our end
  if (it == regions_.begin()) return false;
  --it;
  const uintptr_t rb = it->first;
  return rb + it->second->info.size > begin;
}

std::shared_ptr<Region> TransferEngineImpl::FindLocal(const void* p, uint64_t len) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(begin);
  if (it == regions_.begin()) return nullptr;
  --it;
  const uint64_t offset = begin - it->first;
  if (offset >= it->second->info.size || len > it->second->info.size - offset) return nullptr;
  return it->second;
}

Status TransferEngineImpl::Publish(const std::string& name, std::shared_ptr<Region> region) {
  if (!ValidSegmentName(name)) {
    return InvalidArgument("bad segment name '" + name + "' (1.." + std::to_string(kMaxSegmentName) +
                           " printable characters, no spaces)");
  }
  const std::string key = kSegmentPrefix + name;
  {
    std::shared_lock<std::shared_mutex> lock(mem_mu_);
    if (segments_.count(name) != 0) {
      return FailedPrecondition("segment '" + name + "' is already published by this engine");
    }
    if (Overlaps(region->info.base, region->info.size)) {
      return InvalidArgument("segment '" + name + "' overlaps memory already registered");
    }
  }
  auto existing = options_.metadata->Get(key);
  if (existing.ok()) {
    auto desc = SegmentDescriptor::FromJson(*existing);
    return FailedPrecondition("segment '" + name + "' is already published by '" +
                              (desc.ok() ? desc->owner : std::string("?")) + "'");
  }
  if (existing.status().code() != StatusCode::kNotFound) {
    return existing.status().WithContext("metadata lookup of '" + key + "'");
  }
  region->info.segment_name = name;
  region->info.retiring = &region->retiring;
  region->metadata_key = key;
  SegmentDescriptor desc;
  desc.name = name;
  desc.owner = options_.local_name;
  desc.host_id = host_id_;
  desc.size = region->info.size;
  desc.owner_pid = static_cast<int>(::getpid());
  for (auto& t : transports_) {
    TANDEM_RETURN_IF_ERROR(t->OnRegister(region->info, &desc));
  }
  {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    if (segments_.count(name) != 0 || Overlaps(region->info.base, region->info.size)) {
      return FailedPrecondition("segment '" + name + "' registered concurrently");
    }
    segments_[name] = region;
    regions_[reinterpret_cast<uintptr_t>(region->info.base)] = region;
  }
  Status st = options_.metadata->Put(key, desc.ToJson());
  if (!st.ok()) {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    segments_.erase(name);
    regions_.erase(reinterpret_cast<uintptr_t>(region->info.base));
    return st.WithContext("publishing segment '" + name + "'");
  }
  GetLogger("transfer")->debug("published segment '{}' ({} bytes, shm_fd {}, {})", name,
                               desc.size, desc.shm_fd, desc.tcp_endpoint);
  return OkStatus();
}

StatusOr<void*> TransferEngineImpl::AllocateSegment(const std::string& name, uint64_t size) {
  if (size == 0) return InvalidArgument("segment '" + name + "': size must be > 0");
  if (!ValidSegmentName(name)) {
    return InvalidArgument("bad segment name '" + name + "'");
  }
  TANDEM_ASSIGN_OR_RETURN(SharedMemory shm, CreateSharedMemory(name, size));
  auto region = std::make_shared<Region>();
  region->shm = std::move(shm);
  region->info.base = region->shm.mapping.addr();
  region->info.size = size;
  region->info.memfd = region->shm.fd.get();
  void* base = region->info.base;
  TANDEM_RETURN_IF_ERROR(Publish(name, std::move(region)));
  return base;
}

Status TransferEngineImpl::RegisterSegment(const std::string& name, void* base, uint64_t size) {
  if (base == nullptr || size == 0) {
    return InvalidArgument("segment '" + name + "': null base or zero size");
  }
  auto region = std::make_shared<Region>();
  region->info.base = base;
  region->info.size = size;
  return Publish(name, std::move(region));
}

Status TransferEngineImpl::UnregisterSegment(const std::string& name) {
  std::shared_ptr<Region> region;
  {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    auto it = segments_.find(name);
    if (it == segments_.end()) return NotFound("segment '" + name + "' is not registered here");
    region = it->second;
    segments_.erase(it);
    regions_.erase(reinterpret_cast<uintptr_t>(region->info.base));
  }
  region->retiring.store(true, std::memory_order_release);
  for (auto& t : transports_) t->OnUnregister(region->info);
  Status st = options_.metadata->Delete(region->metadata_key);
  if (!st.ok() && st.code() != StatusCode::kNotFound) {
    GetLogger("transfer")->warn("unpublishing segment '{}': {}", name, st.ToString());
  }
  // Transfers into or out of the segment hold references; wait for them (bounded).
  const auto limit = Clock::now() + kUnregisterWait;
  while (region.use_count() > 1 && Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (region.use_count() > 1) {
    return DeadlineExceeded("segment '" + name + "' unpublished but still in use by a transfer");
  }
  return OkStatus();
}

Status TransferEngineImpl::RegisterLocalMemory(void* base, uint64_t size) {
  if (base == nullptr || size == 0) return InvalidArgument("local memory: null base or zero size");
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  if (Overlaps(base, size)) return InvalidArgument("local memory overlaps memory already registered");
  auto region = std::make_shared<Region>();
  region->info.base = base;
  region->info.size = size;
  regions_[reinterpret_cast<uintptr_t>(base)] = std::move(region);
  return OkStatus();
}

Status TransferEngineImpl::UnregisterLocalMemory(void* base) {
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end()) return NotFound("no local memory registered at this address");
  if (!it->second->info.segment_name.empty()) {
    return FailedPrecondition("memory is segment '" + it->second->info.segment_name +
                              "'; use UnregisterSegment");
  }
  regions_.erase(it);
  return OkStatus();
}

std::shared_ptr<const LocalRegion> TransferEngineImpl::FindSegment(const std::string& name) {
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = segments_.find(name);
  if (it == segments_.end()) return nullptr;
  return std::shared_ptr<const LocalRegion>(it->second, &it->second->info);
}

// ---- Opened segments ----------------------------------------------------------------------

StatusOr<SegmentHandle> TransferEngineImpl::OpenSegment(const std::string& name) {
  auto json = options_.metadata->Get(kSegmentPrefix + name);
  if (!json.ok()) {
    if (json.status().code() == StatusCode::kNotFound) {
      return NotFound("segment '" + name + "' is not published");
    }
    return json.status().WithContext("looking up segment '" + name + "'");
  }
  TANDEM_ASSIGN_OR_RETURN(SegmentDescriptor desc, SegmentDescriptor::FromJson(*json));
  auto opened = std::make_shared<OpenedSegment>();
  std::string tried;
  for (Protocol p : options_.protocols) {
    Transport* t = TransportFor(p);
    if (t == nullptr || !t->CanReach(desc)) continue;
    auto remote = t->Open(desc);
    if (!remote.ok()) {
      GetLogger("transfer")->warn("segment '{}': {} failed ({}); trying the next protocol", name,
                                  ProtocolName(p), remote.status().ToString());
      tried += std::string(tried.empty() ? "" : "; ") + ProtocolName(p) + ": " +
               remote.status().message();
      continue;
    }
    opened->protocol = p;
    opened->transport = t;
    opened->remote = std::move(*remote);
    break;
  }
  if (opened->remote == nullptr) {
    return Unavailable("no usable transport reaches segment '" + name + "' of '" + desc.owner +
                       "'" + (tried.empty() ? std::string() : " (" + tried + ")"));
  }
  if (opened->protocol == Protocol::kTcp) opened->notify_remote = opened->remote;
  opened->desc = std::move(desc);
  std::unique_lock<std::shared_mutex> lock(open_mu_);
  const uint64_t id = next_handle_++;
  opened_[id] = std::move(opened);
  return SegmentHandle{id};
}

Status TransferEngineImpl::CloseSegment(SegmentHandle handle) {
  std::shared_ptr<OpenedSegment> victim;  // released outside the lock
  std::unique_lock<std::shared_mutex> lock(open_mu_);
  auto it = opened_.find(handle.id);
  if (it == opened_.end()) return NotFound("unknown segment handle " + std::to_string(handle.id));
  victim = std::move(it->second);
  opened_.erase(it);
  lock.unlock();
  return OkStatus();
}

StatusOr<Protocol> TransferEngineImpl::SegmentProtocol(SegmentHandle handle) const {
  std::shared_lock<std::shared_mutex> lock(open_mu_);
  auto it = opened_.find(handle.id);
  if (it == opened_.end()) return NotFound("unknown segment handle " + std::to_string(handle.id));
  return it->second->protocol;
}

// ---- Batches -------------------------------------------------------------------------------

StatusOr<BatchId> TransferEngineImpl::SubmitBatch(std::span<const TransferRequest> requests,
                                                  Clock::time_point deadline,
                                                  std::string notification) {
  auto refuse = [&](Status st) -> StatusOr<BatchId> {
    requests_refused_.fetch_add(std::max<size_t>(requests.size(), 1), std::memory_order_relaxed);
    return st;
  };
  if (shutting_down_.load(std::memory_order_acquire)) return refuse(Cancelled("engine shutting down"));
  if (requests.empty()) return refuse(InvalidArgument("empty batch"));
  if (notification.size() > kMaxNotificationBytes) {
    return refuse(InvalidArgument("notification of " + std::to_string(notification.size()) +
                                  " bytes exceeds " + std::to_string(kMaxNotificationBytes)));
  }
  // Validate everything before anything starts.
  std::vector<std::shared_ptr<OpenedSegment>> targets(requests.size());
  std::vector<std::shared_ptr<Region>> locals(requests.size());
  {
    std::shared_lock<std::shared_mutex> open_lock(open_mu_);
    std::shared_lock<std::shared_mutex> mem_lock(mem_mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      const TransferRequest& r = requests[i];
      const std::string where = "request " + std::to_string(i) + ": ";
      if (r.op != OpCode::kRead && r.op != OpCode::kWrite) {
        return refuse(InvalidArgument(where + "unknown op code"));
      }
      if (r.length == 0) return refuse(InvalidArgument(where + "zero length"));
      auto it = opened_.find(r.segment.id);
      if (it == opened_.end()) {
        return refuse(NotFound(where + "unknown segment handle " + std::to_string(r.segment.id)));
      }
      const SegmentDescriptor& d = it->second->desc;
      if (r.remote_offset > d.size || r.length > d.size - r.remote_offset) {
        return refuse(OutOfRange(where + "remote range [" + std::to_string(r.remote_offset) +
                                 ", +" + std::to_string(r.length) + ") outside segment '" +
                                 d.name + "' of " + std::to_string(d.size) + " bytes"));
      }
      if (r.local == nullptr) return refuse(InvalidArgument(where + "null local address"));
      locals[i] = FindLocal(r.local, r.length);
      if (locals[i] == nullptr) {
        return refuse(InvalidArgument(where + "local range of " + std::to_string(r.length) +
                                      " bytes is not inside memory registered with this engine"));
      }
      if (!notification.empty() && i > 0 && r.segment.id != requests[0].segment.id) {
        return refuse(InvalidArgument(where + "a batch with a notification must target one "
                                      "segment; requests 0 and " + std::to_string(i) + " differ"));
      }
      targets[i] = it->second;
    }
  }
  auto batch = std::make_shared<Batch>();
  batch->deadline = deadline;
  batch->notification = std::move(notification);
  batch->size = requests.size();
  batch->requests = std::make_unique<RequestState[]>(requests.size());
  batch->pending.store(requests.size());
  // Count slices before anything can complete (or the reaper can see the batch).
  for (size_t i = 0; i < requests.size(); ++i) {
    const uint64_t slice = std::max<uint64_t>(targets[i]->transport->caps().slice_bytes, 4096);
    RequestState& rs = batch->requests[i];
    rs.op = requests[i].op;
    rs.length = requests[i].length;
    rs.slices_left.store(static_cast<uint32_t>((requests[i].length + slice - 1) / slice));
  }
  if (!batch->notification.empty()) {
    batch->target = targets[0];
    std::lock_guard<std::mutex> lock(batch->target->notify_mu);
    if (batch->target->notify_remote == nullptr) {
      // Notifications always travel over TCP to the owner's listener.
      auto remote = tcp_->Open(batch->target->desc);
      if (!remote.ok()) {
        return refuse(remote.status().WithContext("notification path to '" +
                                                  batch->target->desc.name + "'"));
      }
      batch->target->notify_remote = std::move(*remote);
    }
  }
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    batch->id = next_batch_++;
    batches_[batch->id] = batch;
  }
  reaper_cv_.notify_all();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    const uint64_t slice = std::max<uint64_t>(targets[i]->transport->caps().slice_bytes, 4096);
    for (uint64_t off = 0; off < r.length; off += slice) {
      TransferRequest part = r;
      part.local = static_cast<char*>(r.local) + off;
      part.remote_offset = r.remote_offset + off;
      part.length = std::min(slice, r.length - off);
      // The callback keeps the remote segment (e.g. its mapping) and the local region alive
      // until the transport reports the slice, and lets go of them before the request can be
      // seen finished: once WaitBatch returned and the segment is closed, it is unmapped.
      targets[i]->transport->Submit(
          *targets[i]->remote, part, deadline,
          [this, batch, i, remote = targets[i]->remote, local = locals[i]](Status st) mutable {
            remote.reset();
            local.reset();
            OnSliceDone(batch, i, std::move(st));
          });
    }
  }
  return batch->id;
}

void TransferEngineImpl::OnSliceDone(const std::shared_ptr<Batch>& batch, size_t index, Status st) {
  RequestState& rs = batch->requests[index];
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(rs.error_mu);
    if (rs.slice_error.ok()) rs.slice_error = std::move(st);
  }
  if (rs.slices_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Status final_status;
  {
    std::lock_guard<std::mutex> lock(rs.error_mu);
    final_status = rs.slice_error;
  }
  if (!Finish(batch, index, std::move(final_status))) {
    GetLogger("transfer")->warn("batch {} request {}: transport reported after the engine had "
                                "timed the request out", batch->id, index);
  }
}

bool TransferEngineImpl::Finish(const std::shared_ptr<Batch>& batch, size_t index, Status st) {
  RequestState& rs = batch->requests[index];
  int expected = static_cast<int>(TransferState::kPending);
  if (!rs.state.compare_exchange_strong(expected, kFinishing, std::memory_order_acq_rel)) {
    return false;
  }
  const TransferState final_state = StateFor(st);
  rs.error = std::move(st);
  switch (final_state) {
    case TransferState::kCompleted:
      requests_completed_.fetch_add(1, std::memory_order_relaxed);
      (rs.op == OpCode::kWrite ? bytes_written_ : bytes_read_)
          .fetch_add(rs.length, std::memory_order_relaxed);
      break;
    case TransferState::kTimedOut:
      requests_timed_out_.fetch_add(1, std::memory_order_relaxed);
      batch->not_completed.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      requests_failed_.fetch_add(1, std::memory_order_relaxed);
      batch->not_completed.fetch_add(1, std::memory_order_relaxed);
      break;
  }
  rs.state.store(static_cast<int>(final_state), std::memory_order_release);
  if (batch->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) OnRequestsDone(batch);
  return true;
}

void TransferEngineImpl::OnRequestsDone(const std::shared_ptr<Batch>& batch) {
  if (batch->notification.empty() || batch->not_completed.load() > 0) {
    SettleBatch(batch, OkStatus());
    return;
  }
  if (batch->notify_started.exchange(true)) return;
  if (shutting_down_.load(std::memory_order_acquire) || Clock::now() > batch->deadline) {
    SettleBatch(batch, shutting_down_.load() ? Cancelled("engine shutting down; notification not sent")
                                             : DeadlineExceeded("notification not sent: deadline passed"));
    return;
  }
  std::shared_ptr<OpenedSegment> target;
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    if (batch->done) return;  // settled meanwhile (reaped or shut down)
    target = batch->target;
  }
  std::shared_ptr<RemoteSegment> remote;
  {
    std::lock_guard<std::mutex> lock(target->notify_mu);
    remote = target->notify_remote;
  }
  target.reset();
  tcp_->Notify(*remote, options_.local_name, batch->notification, batch->deadline,
               [this, batch, remote](Status st) mutable {
                 remote.reset();
                 if (st.ok()) notifications_sent_.fetch_add(1, std::memory_order_relaxed);
                 SettleBatch(batch, st.ok() ? st : st.WithContext("notification"));
               });
}

void TransferEngineImpl::SettleBatch(const std::shared_ptr<Batch>& batch, Status notify_error) {
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    if (batch->done) return;
    batch->done = true;
    batch->notify_error = std::move(notify_error);
    // A settled batch holds no segment: closing the handle then releases it at once.
    batch->target.reset();
  }
  batch->cv.notify_all();
}

void TransferEngineImpl::Reap(const std::shared_ptr<Batch>& batch) {
  bool forced = false;
  for (size_t i = 0; i < batch->size; ++i) {
    if (batch->requests[i].state.load(std::memory_order_acquire) ==
        static_cast<int>(TransferState::kPending)) {
      forced |= Finish(batch, i, DeadlineExceeded("no completion within " +
                                                  std::to_string(kReapSlack.count()) +
                                                  " ms after the deadline"));
    }
  }
  if (forced) {
    GetLogger("transfer")->error("batch {}: transport missed the deadline; requests forced to "
                                 "timed out", batch->id);
  }
  // Requests may still be finishing on another thread (between the CAS and the count); a
  // settled notification is only forced once none is pending.
  if (batch->pending.load(std::memory_order_acquire) == 0) {
    SettleBatch(batch, DeadlineExceeded("notification not acknowledged by the deadline"));
  }
}

void TransferEngineImpl::ReaperLoop() {
  std::unique_lock<std::mutex> lock(batch_mu_);
  while (!stopping_) {
    const auto now = Clock::now();
    auto next = now + std::chrono::milliseconds(200);
    std::vector<std::shared_ptr<Batch>> due;
    for (auto& [id, batch] : batches_) {
      {
        std::lock_guard<std::mutex> block(batch->mu);
        if (batch->done) continue;
      }
      const auto reap_at = ReapTime(batch->deadline);
      if (reap_at <= now) {
        due.push_back(batch);
      } else {
        next = std::min(next, reap_at);
      }
    }
    if (!due.empty()) {
      lock.unlock();
      for (auto& b : due) Reap(b);
      lock.lock();
      continue;
    }
    reaper_cv_.wait_until(lock, next);
  }
}

std::shared_ptr<Batch> TransferEngineImpl::LookupBatch(BatchId id) const {
  std::lock_guard<std::mutex> lock(batch_mu_);
  auto it = batches_.find(id);
  return it == batches_.end() ? nullptr : it->second;
}

BatchStatus TransferEngineImpl::Summarize(const Batch& batch) const {
  BatchStatus s;
  Status first_error;
  for (size_t i = 0; i < batch.size; ++i) {
    const int st = batch.requests[i].state.load(std::memory_order_acquire);
    switch (st) {
      case static_cast<int>(TransferState::kCompleted): ++s.completed; break;
      case static_cast<int>(TransferState::kFailed): ++s.failed; break;
      case static_cast<int>(TransferState::kTimedOut): ++s.timed_out; break;
      default: ++s.pending; break;  // pending or finishing
    }
    if ((st == static_cast<int>(TransferState::kFailed) ||
         st == static_cast<int>(TransferState::kTimedOut)) && first_error.ok()) {
      first_error = batch.requests[i].error;
    }
  }
  bool done = false;
  Status notify_error;
  {
    std::lock_guard<std::mutex> lock(batch.mu);
    done = batch.done;
    notify_error = batch.notify_error;
  }
  if (s.pending > 0 || !done) {
    s.state = TransferState::kPending;
  } else if (s.failed > 0) {
    s.state = TransferState::kFailed;
  } else if (s.timed_out > 0) {
    s.state = TransferState::kTimedOut;
  } else if (!notify_error.ok()) {
    s.state = StateFor(notify_error);
    first_error = notify_error;
  } else {
    s.state = TransferState::kCompleted;
  }
  s.first_error = first_error;
  return s;
}

RequestStatus TransferEngineImpl::GetRequestStatus(BatchId id, size_t index) const {
  RequestStatus r;
  auto batch = LookupBatch(id);
  if (batch == nullptr || index >= batch->size) {
    r.state = TransferState::kFailed;
    r.error = NotFound("unknown batch " + std::to_string(id) + " or request index " +
                       std::to_string(index));
    return r;
  }
  const int st = batch->requests[index].state.load(std::memory_order_acquire);
  if (st == kFinishing || st == static_cast<int>(TransferState::kPending)) return r;
  r.state = static_cast<TransferState>(st);
  r.error = batch->requests[index].error;
  return r;
}

BatchStatus TransferEngineImpl::GetBatchStatus(BatchId id) const {
  auto batch = LookupBatch(id);
  if (batch == nullptr) {
    BatchStatus s;
    s.state = TransferState::kFailed;
    s.first_error = NotFound("unknown batch " + std::to_string(id));
    return s;
  }
  return Summarize(*batch);
}

BatchStatus TransferEngineImpl::WaitBatch(BatchId id) {
  auto batch = LookupBatch(id);
  if (batch == nullptr) return GetBatchStatus(id);
  {
    std::unique_lock<std::mutex> lock(batch->mu);
    batch->cv.wait_until(lock, ReapTime(batch->deadline), [&] { return batch->done; });
  }
  Reap(batch);  // no-op unless the transports missed the deadline
  {
    // Reap may have raced with a request finishing on another thread; that thread settles the
    // batch within microseconds, and the bound here keeps WaitBatch finite regardless.
    std::unique_lock<std::mutex> lock(batch->mu);
    batch->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return batch->done; });
  }
  return Summarize(*batch);
}

Status TransferEngineImpl::FreeBatch(BatchId id) {
  std::lock_guard<std::mutex> lock(batch_mu_);
  auto it = batches_.find(id);
  if (it == batches_.end()) return NotFound("unknown batch " + std::to_string(id));
  {
    std::lock_guard<std::mutex> block(it->second->mu);
    if (!it->second->done) {
      return FailedPrecondition("batch " + std::to_string(id) + " still has pending requests");
    }
  }
  batches_.erase(it);
  return OkStatus();
}

// ---- Notifications and counters ------------------------------------------------------------

void TransferEngineImpl::SetNotificationHandler(std::function<void(const Notification&)> handler) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  handler_ = std::move(handler);
}

void TransferEngineImpl::DeliverNotification(const Notification& notification) {
  notifications_received_.fetch_add(1, std::memory_order_relaxed);
  std::function<void(const Notification&)> handler;
  {
    std::lock_guard<std::mutex> lock(handler_mu_);
    handler = handler_;
  }
  if (handler) {
    handler(notification);
  } else {
    GetLogger("transfer")->debug("notification from '{}' for '{}' dropped: no handler",
                                 notification.from, notification.segment);
  }
}

TransferCounters TransferEngineImpl::Counters() const {
  TransferCounters c;
  c.bytes_written = bytes_written_.load();
  c.bytes_read = bytes_read_.load();
  c.requests_completed = requests_completed_.load();
  c.requests_failed = requests_failed_.load();
  c.requests_timed_out = requests_timed_out_.load();
  c.requests_refused = requests_refused_.load();
  c.bytes_served = bytes_served_.load();
  c.notifications_sent = notifications_sent_.load();
  c.notifications_received = notifications_received_.load();
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(TransferEngineOptions options) {
  if (options.local_name.empty()) return InvalidArgument("TransferEngineOptions.local_name is empty");
  if (options.metadata == nullptr) return InvalidArgument("TransferEngineOptions.metadata is null");
  if (options.worker_threads < 1 || options.worker_threads > 256) {
    return InvalidArgument("worker_threads must be in 1..256");
  }
  if (options.protocols.empty()) return InvalidArgument("TransferEngineOptions.protocols is empty");
  auto engine = std::make_unique<TransferEngineImpl>(std::move(options));
  TANDEM_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace tandem::transfer
