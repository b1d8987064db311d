// The transfer engine core: TransferEngineImpl construction (transports), shutdown,
// notifications and counters, and TransferEngine::Create. Registration and opened segments are
// in transfer_engine_segments.cc, batches and request state machines in
// transfer_engine_batch.cc. Data moves in the transports (shm_transport.cc, tcp_transport*.cc).
#include "transfer/transfer_engine.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/shm_transport.h"
#include "transfer/tcp_transport.h"
#include "transfer/transfer_engine_internal.h"
#include "transfer/transfer_util_internal.h"
#include "transfer/transport.h"
#ifdef TANDEM_WITH_UCX
#include "transfer/ucx_transport.h"
#endif

namespace tandem::transfer {
namespace internal {

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
      GetLogger("transfer")
          ->warn("transfer engine '{}': UCX unavailable: {}", options_.local_name,
                 ucx.status().ToString());
    }
  }
#endif
  for (Protocol p : options_.protocols) {
    if (TransportFor(p) == nullptr) {
      GetLogger("transfer")
          ->warn("transfer engine '{}': protocol {} not built in; ignored", options_.local_name,
                 ProtocolName(p));
    }
  }
  reaper_ = std::thread([this] { ReaperLoop(); });
  GetLogger("transfer")
      ->info("transfer engine '{}' listening on {}", options_.local_name, tcp_->endpoint());
  return OkStatus();
}

TransferEngineImpl::~TransferEngineImpl() {
  shutting_down_.store(true, std::memory_order_release);
  {
    MutexLock lock(&batch_mu_);
    stopping_ = true;
  }
  reaper_cv_.NotifyAll();
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
    MutexLock lock(&batch_mu_);
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

// ---- Notifications and counters ------------------------------------------------------------

void TransferEngineImpl::SetNotificationHandler(std::function<void(const Notification&)> handler) {
  MutexLock lock(&handler_mu_);
  handler_ = std::move(handler);
}

void TransferEngineImpl::DeliverNotification(const Notification& notification) {
  notifications_received_.fetch_add(1, std::memory_order_relaxed);
  std::function<void(const Notification&)> handler;
  {
    MutexLock lock(&handler_mu_);
    handler = handler_;
  }
  if (handler) {
    handler(notification);
  } else {
    GetLogger("transfer")
        ->debug("notification from '{}' for '{}' dropped: no handler", notification.from,
                notification.segment);
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

}  // namespace internal

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(TransferEngineOptions options) {
  if (options.local_name.empty())
    return InvalidArgument("TransferEngineOptions.local_name is empty");
  if (options.metadata == nullptr) return InvalidArgument("TransferEngineOptions.metadata is null");
  if (options.worker_threads < 1 || options.worker_threads > 256) {
    return InvalidArgument("worker_threads must be in 1..256");
  }
  if (options.protocols.empty()) return InvalidArgument("TransferEngineOptions.protocols is empty");
  auto engine = std::make_unique<internal::TransferEngineImpl>(std::move(options));
  TANDEM_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace tandem::transfer
