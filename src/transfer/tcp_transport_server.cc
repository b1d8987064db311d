// TCP transport, target side: the data listener. Each accepted connection is served by its own
// thread, one message at a time: writes are received straight into the segment's memory after
// the offset and length were checked against the segment, reads are sent straight from it,
// notifications go to the engine's handler.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/cluster_auth.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/tcp_transport.h"
#include "transfer/tcp_transport_wire_internal.h"

namespace tandem::transfer {
namespace {

constexpr uint64_t kMaxDrainBytes = uint64_t{1} << 40;       // bigger claims are framing errors
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);  // a peer that says nothing goes

// Why a request cannot be served; OK when [offset, offset + length) lies inside the segment.
Status CheckRange(const LocalRegion* region, const std::string& name, uint64_t offset,
                  uint64_t length) {
  if (region == nullptr) return NotFound("no segment '" + name + "' here");
  if (length == 0 || offset > region->size || length > region->size - offset) {
    return OutOfRange("range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") outside segment '" + name + "' of " + std::to_string(region->size) +
                      " bytes");
  }
  return OkStatus();
}

// Sends a reply header, the error text and (successful reads) the payload.
IoResult SendReply(int fd, uint64_t id, const Status& st, const void* payload, uint64_t length,
                   const std::function<bool()>& should_abort, int* err) {
  wire::Header h;
  h.type = wire::MsgType::kReply;
  h.code = static_cast<uint8_t>(st.code());
  h.id = id;
  h.length = payload != nullptr ? length : 0;
  const std::string text = st.ok() ? std::string() : st.message().substr(0, wire::kMaxNameBytes);
  h.name_len = static_cast<uint32_t>(text.size());
  uint8_t hb[wire::kHeaderBytes];
  wire::Encode(h, hb);
  iovec iov[3] = {{hb, sizeof(hb)},
                  {const_cast<char*>(text.data()), text.size()},
                  {const_cast<void*>(payload), payload != nullptr ? length : 0}};
  return SendAll(fd, iov, 3, should_abort, err);
}

}  // namespace

StatusOr<std::unique_ptr<TcpServer>> TcpServer::Start(TransportHost* host,
                                                      const std::string& listen_host, int port) {
  if (port < 0 || port > 65535) return InvalidArgument("tcp_listen_port out of range");
  TANDEM_ASSIGN_OR_RETURN(auto listener, ListenTcp(listen_host, port));
  std::unique_ptr<TcpServer> server(
      new TcpServer(host, std::move(listener.first), listener.second));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpServer::TcpServer(TransportHost* host, UniqueFd listener, int port)
    : host_(host), listener_(std::move(listener)), port_(port) {}

TcpServer::~TcpServer() {
  stopping_.store(true, std::memory_order_release);
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    MutexLock lock(&mu_);
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  ReapFinished(/*all=*/true);
}

int TcpServer::active_connections() {
  MutexLock lock(&mu_);
  int n = 0;
  for (auto& c : conns_) n += c->finished.load() ? 0 : 1;
  return n;
}

void TcpServer::ReapFinished(bool all) {
  std::vector<std::unique_ptr<Conn>> done;
  {
    MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->finished.load(std::memory_order_acquire)) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) {
    if (c->thread.joinable()) c->thread.join();
  }
  // Sockets close as `done` goes out of scope, after their threads ended.
}

void TcpServer::AcceptLoop() {
  auto log = GetLogger("transfer");
  while (!stopping_.load(std::memory_order_acquire)) {
    pollfd p{listener_.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, 50);
    ReapFinished(/*all=*/false);
    if (rc <= 0) continue;
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        log->warn("tcp listener: accept: out of file descriptors");
        ::usleep(10000);
      }
      continue;
    }
    TuneDataSocket(fd);
    auto conn = std::make_unique<Conn>();
    conn->fd = UniqueFd(fd);
    Conn* raw = conn.get();
    MutexLock lock(&mu_);
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void TcpServer::Serve(Conn* conn) {
  auto log = GetLogger("transfer");
  const int fd = conn->fd.get();
  auto stop = [this] { return stopping_.load(std::memory_order_acquire); };
  std::vector<char> scratch;  // drains payloads that cannot be accepted
  int err = 0;
  // Nothing of a segment is read or written before the peer proves the cluster token.
  const auto handshake_deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
  const Status auth = TargetHandshake(
      fd, [&] { return stop() || std::chrono::steady_clock::now() >= handshake_deadline; });
  if (!auth.ok()) {
    CountClusterAuthRefusal();
    log->warn("tcp listener: refused a peer: {}", auth.message());
    ::shutdown(fd, SHUT_RDWR);
    conn->finished.store(true, std::memory_order_release);
    return;
  }
  for (;;) {
    uint8_t hb[wire::kHeaderBytes];
    if (RecvExact(fd, hb, sizeof(hb), stop, &err) != IoResult::kOk) break;  // EOF: peer done
    wire::Header h;
    if (!wire::Decode(hb, &h) || h.type == wire::MsgType::kReply || h.name_len == 0 ||
        h.name_len > wire::kMaxNameBytes || h.from_len > wire::kMaxNameBytes) {
      log->warn("tcp listener: bad framing from a peer; closing its connection");
      break;
    }
    std::string name(h.name_len, '\0');
    if (RecvExact(fd, name.data(), name.size(), stop, &err) != IoResult::kOk) break;
    std::shared_ptr<const LocalRegion> region = host_->FindSegment(name);
    // Stop early (between socket reads) when the segment is being unregistered.
    auto stop_or_retiring = [&] {
      return stop() || (region != nullptr && region->retiring != nullptr &&
                        region->retiring->load(std::memory_order_acquire));
    };
    IoResult r = IoResult::kOk;
    if (h.type == wire::MsgType::kWrite) {
      Status st = CheckRange(region.get(), name, h.offset, h.length);
      if (st.ok()) {
        r = RecvExact(fd, static_cast<char*>(region->base) + h.offset, h.length, stop_or_retiring,
                      &err);
        if (r != IoResult::kOk) break;
        host_->AddBytesServed(h.length);
      } else {
        if (h.length > kMaxDrainBytes) break;
        scratch.resize(64 << 10);
        for (uint64_t left = h.length; left > 0 && r == IoResult::kOk;) {
          const uint64_t n = std::min<uint64_t>(left, scratch.size());
          r = RecvExact(fd, scratch.data(), n, stop, &err);
          left -= n;
        }
        if (r != IoResult::kOk) break;
      }
      r = SendReply(fd, h.id, st, nullptr, 0, stop, &err);
    } else if (h.type == wire::MsgType::kRead) {
      Status st = CheckRange(region.get(), name, h.offset, h.length);
      const void* src = st.ok() ? static_cast<const char*>(region->base) + h.offset : nullptr;
      // Counted before sending: the initiator may see its read complete before SendReply returns.
      if (st.ok()) host_->AddBytesServed(h.length);
      r = SendReply(fd, h.id, st, src, h.length, stop_or_retiring, &err);
    } else {  // notify
      if (h.length > wire::kMaxNotifyBytes) break;
      Notification n;
      n.from.resize(h.from_len);
      n.message.resize(h.length);
      if (RecvExact(fd, n.from.data(), n.from.size(), stop, &err) != IoResult::kOk) break;
      if (RecvExact(fd, n.message.data(), n.message.size(), stop, &err) != IoResult::kOk) break;
      n.segment = name;
      Status st = region != nullptr ? OkStatus() : NotFound("no segment '" + name + "' here");
      if (st.ok()) host_->DeliverNotification(n);
      r = SendReply(fd, h.id, st, nullptr, 0, stop, &err);
    }
    if (r != IoResult::kOk) break;
  }
  ::shutdown(fd, SHUT_RDWR);
  conn->finished.store(true, std::memory_order_release);
}

}  // namespace tandem::transfer
