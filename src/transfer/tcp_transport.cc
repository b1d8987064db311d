// TCP transport, initiator side: per-peer connection pools, the send and receive threads of a
// connection, deadlines and teardown. The target side is tcp_transport_server.cc.
#include "transfer/tcp_transport.h"

#include <sys/socket.h>

#include <deque>
#include <map>
#include <unordered_map>

#include "common/cluster_auth.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/tcp_transport_wire_internal.h"

namespace tandem::transfer {
namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(3);
constexpr auto kDeadlineCheckPeriod = std::chrono::milliseconds(2);

// One request (or notification) on its way through a connection.
struct TcpOp {
  wire::MsgType type = wire::MsgType::kWrite;
  uint64_t id = 0;            // assigned by the sender thread
  void* local = nullptr;      // write: source; read: destination (caller's registered memory)
  uint64_t offset = 0;        // bytes from the remote segment base
  uint64_t length = 0;        // payload bytes (write/read), message bytes (notify)
  std::string segment;        // remote segment name
  std::string from, message;  // notify only
  Clock::time_point deadline;
  CompletionCallback done;
};
using OpPtr = std::shared_ptr<TcpOp>;

Status FromWireCode(uint8_t code, std::string message) {
  if (code == 0) return OkStatus();
  if (code > static_cast<uint8_t>(kLastStatusCode))
    code = static_cast<uint8_t>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), std::move(message));
}

}  // namespace

// One initiator connection: a sender thread (connects, then sends queued requests in order) and
// a receiver thread (reads replies, watches deadlines, and owns the teardown).
//
// Invariants:
// - fd_ is assigned once, under mu_, and closed only by the destructor after both threads ended;
//   other threads only shutdown() it, so its number is never reused under them.
// - an op is in exactly one of queue_ (nothing sent), outstanding_ (sending started, reply not
//   fully received) or completed (done called, op dropped).
// - done is called without holding mu_, and at most once per op.
class TcpConnection {
 public:
  TcpConnection(std::string host, int port, std::string endpoint)
      : host_(std::move(host)), port_(port), endpoint_(std::move(endpoint)) {
    sender_ = std::thread([this] { SenderMain(); });
  }

  ~TcpConnection() {
    Break(Cancelled("connection to " + endpoint_ + " closed"));
    if (sender_.joinable()) sender_.join();
    // The receiver is started by the sender thread, so it is visible once the sender ended.
    if (receiver_.joinable()) receiver_.join();
  }

  // Queues op. False (op untouched) once the connection is broken.
  bool Enqueue(const OpPtr& op) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (broken_.load(std::memory_order_relaxed)) return false;
      queue_.push_back(op);
      pending_bytes_.fetch_add(static_cast<int64_t>(op->length), std::memory_order_relaxed);
    }
    cv_.NotifyAll();
    return true;
  }

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  int64_t pending_bytes() const { return pending_bytes_.load(std::memory_order_relaxed); }

  // Marks the connection broken with `reason` (the first reason wins) and shuts the socket down
  // so that blocked I/O returns. Never blocks on I/O; idempotent.
  void Break(Status reason) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (!broken_.load(std::memory_order_relaxed)) {
        break_reason_ = std::move(reason);
        broken_.store(true, std::memory_order_release);
      }
      if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
    }
    cv_.NotifyAll();
  }

 private:
  void SenderMain() TANDEM_EXCLUDES(mu_) {
    if (!Connect()) {
      FinishSender();
      Teardown();  // the receiver never started: this thread owns the teardown
      return;
    }
    receiver_ = std::thread([this] { ReceiverMain(); });
    const int fd = fd_.get();
    auto aborted = [this] { return broken(); };
    for (;;) {
      OpPtr op;
      bool expired = false;
      {
        MutexLock lock(&mu_);
        while (!broken() && queue_.empty()) cv_.Wait(&mu_);
        if (broken()) break;
        op = std::move(queue_.front());
        queue_.pop_front();
        if (Clock::now() > op->deadline) {
          expired = true;  // completed below, without mu_
        } else {
          op->id = next_id_++;
          outstanding_.emplace(op->id, op);
          sending_id_ = op->id;
        }
      }
      if (expired) {
        Complete(op, DeadlineExceeded("tcp request to " + endpoint_ +
                                      " not started before its deadline"));
        continue;
      }
      wire::Header h;
      h.type = op->type;
      h.id = op->id;
      h.offset = op->offset;
      h.length = op->length;
      h.name_len = static_cast<uint32_t>(op->segment.size());
      h.from_len = static_cast<uint32_t>(op->from.size());
      uint8_t hb[wire::kHeaderBytes];
      wire::Encode(h, hb);
      iovec iov[4];
      int n = 0;
      iov[n++] = {hb, sizeof(hb)};
      iov[n++] = {op->segment.data(), op->segment.size()};
      if (op->type == wire::MsgType::kWrite) {
        iov[n++] = {op->local, op->length};  // straight from the caller's registered memory
      } else if (op->type == wire::MsgType::kNotify) {
        iov[n++] = {op->from.data(), op->from.size()};
        iov[n++] = {op->message.data(), op->message.size()};
      }
      int err = 0;
      const IoResult r = SendAll(fd, iov, n, aborted, &err);
      {
        MutexLock lock(&mu_);
        sending_id_ = 0;
      }
      cv_.NotifyAll();
      if (r == IoResult::kError) {
        Break(Unavailable(ErrnoStatus("send to " + endpoint_, err).message()));
        break;
      }
      if (r != IoResult::kOk) break;
    }
    FinishSender();
  }

  // Connects with a bounded wait; queued requests past their deadline are failed meanwhile.
  bool Connect() TANDEM_EXCLUDES(mu_) {
    auto sock = StartConnect(host_, port_);
    if (!sock.ok()) {
      Break(Unavailable(sock.status().message()));
      return false;
    }
    {
      MutexLock lock(&mu_);
      fd_ = std::move(*sock);
      if (broken()) return false;
    }
    const auto give_up = Clock::now() + kConnectTimeout;
    for (;;) {
      const Status st = FinishConnect(fd_.get(), Clock::now() + std::chrono::milliseconds(20));
      if (st.ok()) {
        const Status auth = InitiatorHandshake(
            fd_.get(), [&] { return broken() || CheckDeadlines() || Clock::now() >= give_up; });
        if (!auth.ok()) {
          if (auth.code() == StatusCode::kUnauthenticated) CountClusterAuthRefusal();
          Break(Unavailable("connect to " + endpoint_ + ": " + auth.message()));
          return false;
        }
        return !broken();
      }
      if (st.code() != StatusCode::kDeadlineExceeded) {
        Break(Unavailable("connect to " + endpoint_ + ": " + st.message()));
        return false;
      }
      if (broken() || CheckDeadlines()) return false;
      if (Clock::now() >= give_up) {
        Break(Unavailable("connect to " + endpoint_ + " timed out"));
        return false;
      }
    }
  }

  void FinishSender() TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      sender_done_ = true;
    }
    cv_.NotifyAll();
  }

  void ReceiverMain() TANDEM_EXCLUDES(mu_) {
    const int fd = fd_.get();
    auto should_abort = [this] { return broken() || CheckDeadlines(); };
    for (;;) {
      uint8_t hb[wire::kHeaderBytes];
      int err = 0;
      IoResult r = RecvExact(fd, hb, sizeof(hb), should_abort, &err);
      if (r != IoResult::kOk) {
        BreakOnIo(r, err);
        break;
      }
      wire::Header h;
      if (!wire::Decode(hb, &h) || h.type != wire::MsgType::kReply ||
          h.name_len > wire::kMaxNameBytes) {
        Break(DataLoss("bad reply framing from " + endpoint_));
        break;
      }
      std::string text(h.name_len, '\0');
      r = RecvExact(fd, text.data(), text.size(), should_abort, &err);
      if (r != IoResult::kOk) {
        BreakOnIo(r, err);
        break;
      }
      // The sender may not have returned from sendmsg yet for this very request (a reply can
      // overtake it; a misbehaving peer may even answer early): wait until it let go of the
      // buffer before completing the request.
      if (!WaitNotSending(h.id)) break;
      OpPtr op;
      {
        MutexLock lock(&mu_);
        auto it = outstanding_.find(h.id);
        if (it != outstanding_.end()) op = it->second;
      }
      if (op == nullptr) {
        Break(DataLoss("reply from " + endpoint_ + " for unknown request " + std::to_string(h.id)));
        break;
      }
      Status st = FromWireCode(h.code, endpoint_ + ": " + text);
      if (st.ok() && op->type == wire::MsgType::kRead) {
        if (h.length != op->length) {
          Break(DataLoss("read reply from " + endpoint_ + " has " + std::to_string(h.length) +
                         " bytes, asked " + std::to_string(op->length)));
          break;
        }
        // Straight into the caller's buffer. The op stays in outstanding_ meanwhile, so a
        // teardown (which only this thread performs) still completes it.
        r = RecvExact(fd, op->local, op->length, should_abort, &err);
        if (r != IoResult::kOk) {
          BreakOnIo(r, err);
          break;
        }
      }
      {
        MutexLock lock(&mu_);
        outstanding_.erase(h.id);
      }
      Complete(op, std::move(st));
    }
    Teardown();
  }

  // False when the connection broke (or a deadline passed) while waiting.
  bool WaitNotSending(uint64_t id) TANDEM_EXCLUDES(mu_) {
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (sending_id_ != id) return true;
        cv_.WaitUntil(&mu_, Clock::now() + std::chrono::milliseconds(20));
        if (sending_id_ != id) return true;
      }
      if (broken() || CheckDeadlines()) return false;
    }
  }

  void BreakOnIo(IoResult r, int err) TANDEM_EXCLUDES(mu_) {
    if (r == IoResult::kClosed) {
      Break(Unavailable("peer " + endpoint_ + " closed the connection"));
    } else if (r == IoResult::kError) {
      Break(Unavailable(ErrnoStatus("recv from " + endpoint_, err).message()));
    }
    // kAborted: the connection is already broken, with its reason.
  }

  // Fails queued requests past their deadline (nothing of theirs was sent). Returns true, after
  // breaking the connection, when a request that started sending is past its deadline. Cheap
  // when called often: scans at most every kDeadlineCheckPeriod.
  bool CheckDeadlines() TANDEM_EXCLUDES(mu_) {
    const auto now = Clock::now();
    if (now < next_check_) return false;
    next_check_ = now + kDeadlineCheckPeriod;
    std::vector<OpPtr> expired;
    bool started_expired = false;
    {
      MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->deadline < now) {
          expired.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      for (const auto& [id, op] : outstanding_) {
        if (op->deadline < now) {
          started_expired = true;
          break;
        }
      }
    }
    for (auto& op : expired) {
      Complete(
          op, DeadlineExceeded("tcp request to " + endpoint_ + " not started before its deadline"));
    }
    if (started_expired) {
      Break(Unavailable("connection to " + endpoint_ +
                        " closed because a request on it passed its deadline"));
    }
    return started_expired;
  }

  // Waits until the sender thread stopped touching buffers, then completes every remaining op:
  // those past their deadline with kDeadlineExceeded, the others with the break reason.
  void Teardown() TANDEM_EXCLUDES(mu_) {
    std::deque<OpPtr> queued;
    std::unordered_map<uint64_t, OpPtr> outstanding;
    Status reason;
    {
      MutexLock lock(&mu_);
      if (!broken_.load(std::memory_order_relaxed)) {
        break_reason_ = Unavailable("connection to " + endpoint_ + " closed");
        broken_.store(true, std::memory_order_release);
      }
      if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
      cv_.NotifyAll();
      // SendAll notices broken_ within one 50 ms send-timeout slice (or at once on EPIPE).
      // (The predicate runs inside the wait, with mu_ held.)
      auto sender_done = [this] {
        mu_.AssertHeld();
        return sender_done_;
      };
      while (!sender_done_) {
        if (!cv_.WaitFor(&mu_, std::chrono::seconds(5), sender_done)) {
          GetLogger("transfer")->error("tcp sender to {} slow to stop", endpoint_);
        }
      }
      queued.swap(queue_);
      outstanding.swap(outstanding_);
      reason = break_reason_;
    }
    const auto now = Clock::now();
    auto fail = [&](const OpPtr& op) {
      if (op->deadline < now) {
        Complete(op, DeadlineExceeded("tcp request to " + endpoint_ + " passed its deadline (" +
                                      reason.message() + ")"));
      } else {
        Complete(op, reason);
      }
    };
    for (auto& op : queued) fail(op);
    for (auto& [id, op] : outstanding) fail(op);
    finished_.store(true, std::memory_order_release);
  }

  // Runs op's callback; never with mu_ held (see the class invariants).
  void Complete(const OpPtr& op, Status st) TANDEM_EXCLUDES(mu_) {
    pending_bytes_.fetch_sub(static_cast<int64_t>(op->length), std::memory_order_relaxed);
    CompletionCallback done = std::move(op->done);
    if (done) done(std::move(st));
  }

  const std::string host_;
  const int port_;
  const std::string endpoint_;

  mutable Mutex mu_;
  CondVar cv_;
  // Not annotated: assigned once under mu_, then read without it by the sender and receiver
  // threads (which start using it only after the assignment); see the class invariants.
  UniqueFd fd_;
  std::deque<OpPtr> queue_ TANDEM_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, OpPtr> outstanding_ TANDEM_GUARDED_BY(mu_);
  uint64_t next_id_ TANDEM_GUARDED_BY(mu_) = 1;
  uint64_t sending_id_ TANDEM_GUARDED_BY(mu_) = 0;  // op inside SendAll, 0 if none
  bool sender_done_ TANDEM_GUARDED_BY(mu_) = false;
  Status break_reason_ TANDEM_GUARDED_BY(mu_);
  std::atomic<bool> broken_{false};        // written under mu_, read without it
  std::atomic<bool> finished_{false};      // teardown done: no op left, threads ending
  std::atomic<int64_t> pending_bytes_{0};  // queued + outstanding payload bytes
  Clock::time_point next_check_{};         // receiver (or connecting sender) thread only
  std::thread sender_;
  std::thread receiver_;  // started by the sender thread
};

// Connection pools by peer endpoint, shared by the transport and its opened segments (which
// may be released on any thread, even after the transport is gone).
// Lock order: PeerTable::mu before TcpConnection::mu_. Completion callbacks run with neither
// held (they may release a segment, which takes PeerTable::mu).
struct PeerTable {
  struct Peer {
    std::string host;
    int port = 0;
    int open_segments = 0;
    std::vector<std::unique_ptr<TcpConnection>> conns;  // connections_per_peer slots
  };

  explicit PeerTable(int per_peer) : connections_per_peer(per_peer) {}

  // Sends op on a connection to `endpoint`, or completes it with an error.
  void Enqueue(const std::string& endpoint, const OpPtr& op) TANDEM_EXCLUDES(mu) {
    Status error;
    {
      // Enqueue under the table lock: the janitor may destroy a connection that breaks, but
      // only after taking it out of the table under this lock.
      MutexLock lock(&mu);
      for (int attempt = 0; attempt <= connections_per_peer; ++attempt) {
        if (stopping) {
          error = Cancelled("transfer engine shutting down");
          break;
        }
        auto it = peers.find(endpoint);
        if (it == peers.end()) {
          error = FailedPrecondition("segment of " + endpoint + " is closed");
          break;
        }
        if (Pick(endpoint, it->second)->Enqueue(op)) return;
        error = Unavailable("connections to " + endpoint + " keep breaking");
      }
    }
    CompletionCallback done = std::move(op->done);
    done(error);
  }

  // The live connection with the fewest queued bytes; opens a new one in a free (or broken)
  // slot while every live connection has work. Called with mu held.
  TcpConnection* Pick(const std::string& endpoint, Peer& peer) TANDEM_REQUIRES(mu) {
    TcpConnection* best = nullptr;
    int free_slot = -1;
    for (size_t i = 0; i < peer.conns.size(); ++i) {
      auto& c = peer.conns[i];
      if (c == nullptr || c->broken()) {
        if (free_slot < 0) free_slot = static_cast<int>(i);
        continue;
      }
      if (best == nullptr || c->pending_bytes() < best->pending_bytes()) best = c.get();
    }
    if (free_slot >= 0 && (best == nullptr || best->pending_bytes() > 0)) {
      auto& slot = peer.conns[free_slot];
      if (slot != nullptr) retired.push_back(std::move(slot));
      slot = std::make_unique<TcpConnection>(peer.host, peer.port, endpoint);
      best = slot.get();
    }
    return best;
  }

  void Release(const std::string& endpoint) TANDEM_EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      auto it = peers.find(endpoint);
      if (it == peers.end() || --it->second.open_segments > 0) return;
      for (auto& c : it->second.conns) {
        if (c == nullptr) continue;
        c->Break(Cancelled("last segment of " + endpoint + " closed"));
        retired.push_back(std::move(c));
      }
      peers.erase(it);
    }
    cv.NotifyAll();
  }

  const int connections_per_peer;
  Mutex mu;
  CondVar cv;  // wakes the janitor
  bool stopping TANDEM_GUARDED_BY(mu) = false;
  std::map<std::string, Peer> peers TANDEM_GUARDED_BY(mu);
  std::vector<std::unique_ptr<TcpConnection>> retired TANDEM_GUARDED_BY(mu);  // janitor destroys
};

namespace {

class TcpRemoteSegment : public RemoteSegment {
 public:
  TcpRemoteSegment(SegmentDescriptor desc, std::shared_ptr<PeerTable> peers)
      : desc_(std::move(desc)), peers_(std::move(peers)) {}
  ~TcpRemoteSegment() override { peers_->Release(desc_.tcp_endpoint); }
  const SegmentDescriptor& descriptor() const override { return desc_; }
  PeerTable& peers() const { return *peers_; }

 private:
  const SegmentDescriptor desc_;
  std::shared_ptr<PeerTable> peers_;
};

}  // namespace

StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(TransportHost* host,
                                                             TcpTransportOptions options) {
  if (options.connections_per_peer < 1 || options.connections_per_peer > 64) {
    return InvalidArgument("tcp_connections_per_peer must be in 1..64, got " +
                           std::to_string(options.connections_per_peer));
  }
  TANDEM_ASSIGN_OR_RETURN(auto server,
                          TcpServer::Start(host, options.listen_host, options.listen_port));
  std::string adv = options.advertise_host.empty() ? options.listen_host : options.advertise_host;
  if (adv.empty() || adv == "0.0.0.0" || adv == "::") {
    return InvalidArgument("tcp_advertise_host is required when listening on '" +
                           options.listen_host + "'");
  }
  if (adv.find(':') != std::string::npos) adv = "[" + adv + "]";
  std::string endpoint = adv + ":" + std::to_string(server->port());
  return std::unique_ptr<TcpTransport>(
      new TcpTransport(std::move(server), std::move(endpoint), options.connections_per_peer));
}

TcpTransport::TcpTransport(std::unique_ptr<TcpServer> server, std::string endpoint,
                           int connections_per_peer)
    : server_(std::move(server)),
      endpoint_(std::move(endpoint)),
      peers_(std::make_shared<PeerTable>(connections_per_peer)) {
  janitor_ = std::thread([this] { JanitorLoop(); });
}

TcpTransport::~TcpTransport() {
  std::vector<std::unique_ptr<TcpConnection>> all;
  {
    MutexLock lock(&peers_->mu);
    peers_->stopping = true;
    for (auto& [endpoint, peer] : peers_->peers) {
      for (auto& c : peer.conns) {
        if (c != nullptr) all.push_back(std::move(c));
      }
    }
    for (auto& c : peers_->retired) all.push_back(std::move(c));
    peers_->retired.clear();
  }
  peers_->cv.NotifyAll();
  if (janitor_.joinable()) janitor_.join();
  for (auto& c : all) c->Break(Cancelled("transfer engine shutting down"));
  all.clear();  // joins every connection's threads; their requests end with kCancelled
  server_.reset();
}

void TcpTransport::JanitorLoop() {
  for (;;) {
    std::vector<std::unique_ptr<TcpConnection>> doomed;
    {
      MutexLock lock(&peers_->mu);
      peers_->cv.WaitUntil(&peers_->mu, Clock::now() + std::chrono::milliseconds(100));
      if (peers_->stopping) return;  // the destructor takes over
      for (auto& [endpoint, peer] : peers_->peers) {
        for (auto& c : peer.conns) {
          if (c != nullptr && c->finished()) doomed.push_back(std::move(c));
        }
      }
      for (auto& c : peers_->retired) doomed.push_back(std::move(c));
      peers_->retired.clear();
    }
    doomed.clear();  // joins threads and closes sockets, without holding the table lock
  }
}

TransportCaps TcpTransport::caps() const {
  TransportCaps c;
  c.zero_copy = true;  // sendmsg from / recv into registered memory
  c.slice_bytes = 1 << 20;
  return c;
}

Status TcpTransport::OnRegister(const LocalRegion& region, SegmentDescriptor* desc) {
  desc->tcp_endpoint = endpoint_;
  return OkStatus();
}

bool TcpTransport::CanReach(const SegmentDescriptor& remote) const {
  return ParseEndpoint(remote.tcp_endpoint).ok();
}

StatusOr<std::unique_ptr<RemoteSegment>> TcpTransport::Open(const SegmentDescriptor& remote) {
  TANDEM_ASSIGN_OR_RETURN(auto host_port, ParseEndpoint(remote.tcp_endpoint));
  {
    MutexLock lock(&peers_->mu);
    if (peers_->stopping) return Cancelled("transfer engine shutting down");
    auto& peer = peers_->peers[remote.tcp_endpoint];
    if (peer.conns.empty()) {
      peer.host = host_port.first;
      peer.port = host_port.second;
      peer.conns.resize(static_cast<size_t>(peers_->connections_per_peer));
    }
    ++peer.open_segments;
  }
  return std::unique_ptr<RemoteSegment>(std::make_unique<TcpRemoteSegment>(remote, peers_));
}

void TcpTransport::Submit(RemoteSegment& segment, const TransferRequest& request,
                          Clock::time_point deadline, CompletionCallback done) {
  auto& seg = static_cast<TcpRemoteSegment&>(segment);
  auto op = std::make_shared<TcpOp>();
  op->type = request.op == OpCode::kWrite ? wire::MsgType::kWrite : wire::MsgType::kRead;
  op->local = request.local;
  op->offset = request.remote_offset;
  op->length = request.length;
  op->segment = seg.descriptor().name;
  op->deadline = deadline;
  op->done = std::move(done);
  seg.peers().Enqueue(seg.descriptor().tcp_endpoint, op);
}

void TcpTransport::Notify(RemoteSegment& segment, const std::string& from,
                          const std::string& message, Clock::time_point deadline,
                          CompletionCallback done) {
  auto& seg = static_cast<TcpRemoteSegment&>(segment);
  auto op = std::make_shared<TcpOp>();
  op->type = wire::MsgType::kNotify;
  op->length = message.size();
  op->segment = seg.descriptor().name;
  op->from = from;
  op->message = message;
  op->deadline = deadline;
  op->done = std::move(done);
  seg.peers().Enqueue(seg.descriptor().tcp_endpoint, op);
}

int TcpTransport::open_connections() const {
  MutexLock lock(&peers_->mu);
  int n = 0;
  for (const auto& [endpoint, peer] : peers_->peers) {
    for (const auto& c : peer.conns) n += (c != nullptr && !c->finished()) ? 1 : 0;
  }
  return n;
}

}  // namespace tandem::transfer
