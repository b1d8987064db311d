// TCP transport. Target side: a data listener (TcpServer) that receives writes straight into
// registered segment memory, serves reads straight from it and delivers notifications. Initiator
// side: a few connections per peer endpoint; requests are spread over them by queued bytes and
// sent as header + payload with one sendmsg from the caller's buffer (no staging copies); read
// replies are received straight into the caller's buffer.
//
// Failure and deadline rules (per connection):
// - a socket error or EOF (peer died, reset) fails every request queued or in flight on that
//   connection at once, with the reason;
// - a request past its deadline that has not started sending is failed with kDeadlineExceeded
//   and the connection is kept;
// - a request past its deadline that has started (bytes sent, reply pending or partially
//   received) closes the connection: it is shut down, the sender thread is waited for, and only
//   then is every request on it completed (the late one with kDeadlineExceeded, the others with
//   kUnavailable). So once a timeout is reported no thread touches that request's buffer again.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "transfer/transfer_util_internal.h"
#include "transfer/transport.h"

namespace tandem::transfer {

struct TcpTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;           // 0: ephemeral
  std::string advertise_host;    // empty: listen_host
  int connections_per_peer = 4;  // 1..64
};

// The target side: accepts connections and serves them, one thread per connection.
class TcpServer {
 public:
  // host outlives the server.
  static StatusOr<std::unique_ptr<TcpServer>> Start(TransportHost* host,
                                                    const std::string& listen_host, int port);
  // Closes the listener and every connection, joins all threads.
  ~TcpServer();
  int port() const { return port_; }
  // Connections currently being served (for tests).
  int active_connections() TANDEM_EXCLUDES(mu_);

 private:
  struct Conn {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  TcpServer(TransportHost* host, UniqueFd listener, int port);
  void AcceptLoop() TANDEM_EXCLUDES(mu_);
  void Serve(Conn* conn);
  void ReapFinished(bool all) TANDEM_EXCLUDES(mu_);

  TransportHost* const host_;
  UniqueFd listener_;
  const int port_;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_ TANDEM_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

struct PeerTable;  // tcp_transport.cc

class TcpTransport : public Transport {
 public:
  static StatusOr<std::unique_ptr<TcpTransport>> Create(TransportHost* host,
                                                        TcpTransportOptions options);
  ~TcpTransport() override;

  Protocol protocol() const override { return Protocol::kTcp; }
  TransportCaps caps() const override;
  Status OnRegister(const LocalRegion& region, SegmentDescriptor* desc) override;
  void OnUnregister(const LocalRegion& region) override {}
  bool CanReach(const SegmentDescriptor& remote) const override;
  StatusOr<std::unique_ptr<RemoteSegment>> Open(const SegmentDescriptor& remote) override;
  void Submit(RemoteSegment& segment, const TransferRequest& request, Clock::time_point deadline,
              CompletionCallback done) override;

  // Sends a notification to the owner of `segment` (opened by this transport) on one of the
  // peer's connections; done(OK) once the owner's handler has returned.
  void Notify(RemoteSegment& segment, const std::string& from, const std::string& message,
              Clock::time_point deadline, CompletionCallback done);

  // "host:port" advertised in descriptors.
  const std::string& endpoint() const { return endpoint_; }
  // Initiator connections currently open, all peers together (for tests).
  int open_connections() const;

 private:
  TcpTransport(std::unique_ptr<TcpServer> server, std::string endpoint, int connections_per_peer);
  void JanitorLoop();

  std::unique_ptr<TcpServer> server_;
  const std::string endpoint_;
  std::shared_ptr<PeerTable> peers_;  // shared with opened segments
  std::thread janitor_;               // destroys retired connections off their own threads
};

}  // namespace tandem::transfer
