// An HTTP/1.1 server on an event loop (Boost.Asio and Boost.Beast from Debian's
// libboost1.74-dev): the front door that must stay open under many idle, slow or streaming
// clients. A connection costs a socket, a few KiB of buffers and a timer, never a thread: the
// event loop reads requests and writes answers; a complete request goes to a small pool of
// handler threads, which answer through an Exchange from any thread, at once or later (a
// stream of chunks fed as output arrives).
//
//   HttpDoor door(options, [](Request req, std::shared_ptr<Exchange> ex) {
//     ex->Respond({.status = 200, .content_type = "text/plain", .body = "hi"});
//   });
//   TANDEM_RETURN_IF_ERROR(door.Bind());
//   std::thread t([&] { door.Run(); });
//   ...
//   door.Stop(); t.join();
//
// Deadlines (each one closes the connection when it passes, counted in DoorStats):
// - idle: an open connection with no request started (keep-alive between requests too);
// - request: from a request's first byte until its head and body are read (a slow sender);
// - write: each write of an answer or a chunk (a client that stops reading).
// Limits: header bytes (431), body bytes (413), open connections (beyond: accepted and closed).
// While a request is being answered, the door watches its connection: the client closing it (EOF,
// a half-close included, or a reset) makes the exchange gone at once, whole answers too, so the
// work behind it can stop. Bytes of a next pipelined request end the watch (they are not read
// before the answer).
// "Expect: 100-continue" is answered before the body is read.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem::http_door {

struct Request {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: path and query
  std::string path;                                          // target without the query
  std::vector<std::pair<std::string, std::string>> headers;  // in the order sent
  std::string body;
  // The first header of that name (ASCII case-insensitive), or "" when there is none.
  std::string Header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type;  // empty: no Content-Type
  std::string body;          // ignored by BeginStream
  std::vector<std::pair<std::string, std::string>> headers;
  void SetHeader(std::string name, std::string value);
};

// The answer to one request. Thread-safe: any thread may call it, once the handler has it.
// Use exactly one of Respond, or BeginStream then Write... then End. Dropping the last
// reference without answering sends a 500 (a handler bug must not hang the client).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void Respond(Response response) = 0;
  // Sends the status line and headers of a chunked answer.
  virtual void BeginStream(Response head) = 0;
  // Queues one piece of a stream (pieces queued before BeginStream wait for its head). Returns
  // false once the client is gone (a write failed or timed out, or the connection closed):
  // nothing more will be sent.
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;  // the last chunk; the connection may then serve its next request
  virtual bool gone() const = 0;
  // Bytes queued and not yet written.
  virtual size_t backlog_bytes() const = 0;
  // Runs `fn` on an event-loop thread (it must not block) each time the backlog has been
  // written out, and once when the client goes away (at once if it already has). Set it before
  // the first Write.
  virtual void OnWritable(std::function<void()> fn) = 0;
  // Keeps `owned` alive until the answer is fully written or abandoned.
  virtual void Hold(std::shared_ptr<void> owned) = 0;
  // Runs `fn` on an event-loop thread at `at` (now when it is past or unset), never at the same
  // time as another function scheduled on this exchange or the exchange's own writes; `fn` must
  // not block. Pending functions of a stopped door are dropped.
  virtual void Schedule(std::function<void()> fn,
                        std::chrono::steady_clock::time_point at = {}) = 0;
};

using Handler = std::function<void(Request request, std::shared_ptr<Exchange> exchange)>;

struct DoorOptions {
  std::string host = "127.0.0.1";
  int port = 0;             // 0: any free port
  int io_threads = 1;       // event-loop threads
  int handler_threads = 8;  // run handlers (they may block: tokenizing, submitting)
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 8 << 20;
  size_t max_connections = 0;     // 0: from the process's file-descriptor limit
  double idle_timeout_s = 10;     // no request started on an open connection
  double request_timeout_s = 30;  // first byte of a request until it is read whole
  double write_timeout_s = 30;    // one write of an answer or a chunk
  // The answer to a request the door itself refuses (400 unreadable, 413 body too large, 431
  // header too large), given the status and a reason; null: a plain-text body.
  std::function<Response(int status, const std::string& reason)> error_response;
};

// Counters since start. Thread-safe snapshot.
struct DoorStats {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;  // over max_connections
  int64_t idle_timeouts = 0;        // closed with no request started
  int64_t request_timeouts = 0;     // a request not read whole in time
  int64_t write_timeouts = 0;       // the client stopped reading
  int64_t bad_requests = 0;         // 400 / 413 / 431 answered by the door
  int64_t requests = 0;             // handed to the handler
  int64_t client_closes = 0;        // connections closed by the client while it was answered
};

// Raises the process's soft limit of open files to its hard limit, so that a server can hold as
// many connections as the system lets it (call once at start, before the door is made).
// Returns the soft limit now in force.
size_t RaiseOpenFileLimit();

class HttpDoor {
 public:
  HttpDoor(DoorOptions options, Handler handler);
  // Stop()s and joins its handler threads. Exchanges must not be used after it (a server's
  // backend stops feeding them first).
  ~HttpDoor();
  HttpDoor(const HttpDoor&) = delete;
  HttpDoor& operator=(const HttpDoor&) = delete;

  // Binds and listens (Unavailable when the address is taken or invalid).
  Status Bind();
  int port() const;  // once Bind() returned OK
  // Serves until Stop() (the calling thread is one of the event-loop threads).
  void Run();
  // Closes the listener and every connection; Run() returns. Idempotent, any thread.
  void Stop();
  DoorStats Stats() const;
  size_t max_connections() const;

  class Impl;  // opaque (door.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http_door
