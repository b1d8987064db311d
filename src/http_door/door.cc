#include "http_door/door.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>
#include <thread>

namespace tandem::http_door {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// File descriptors kept back from connections: model files, worker and pool sockets, logs.
constexpr size_t kReservedDescriptors = 256;

size_t DefaultMaxConnections() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 10000;
  const size_t fds = static_cast<size_t>(limit.rlim_cur);
  return fds > 2 * kReservedDescriptors ? fds - kReservedDescriptors : fds / 2;
}

// How long a connection closed after its answer keeps reading what the client still sends.
constexpr auto kLingerTime = std::chrono::seconds(2);

// Pieces of a stream waiting on the event loop are sent as one chunk of at most this size.
constexpr size_t kMaxChunkBytes = 256 << 10;

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoringCase(key, name)) return value;
  }
  return "";
}

void Response::SetHeader(std::string name, std::string value) {
  for (auto& [key, old] : headers) {
    if (EqualsIgnoringCase(key, name)) {
      old = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

struct Counters {
  std::atomic<int64_t> open{0}, accepted{0}, refused{0}, idle_timeouts{0}, request_timeouts{0},
      write_timeouts{0}, bad_requests{0}, requests{0}, client_closes{0};
};

// The state shared by the door's threads. Connections hold a plain pointer: they live in the
// event loop's queue, which ioc_ destroys (running their destructors) before the members
// declared above it.
class HttpDoor::Impl {
 public:
  Impl(DoorOptions options, Handler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        ioc_(std::max(1, options_.io_threads)),
        acceptor_(ioc_),
        retry_timer_(ioc_),
        pool_(static_cast<size_t>(std::max(1, options_.handler_threads))),
        max_connections_(options_.max_connections > 0 ? options_.max_connections
                                                      : DefaultMaxConnections()) {}

  Status Bind();
  void Accept();
  void Run();
  void Stop();

  Response ErrorResponse(int status, const std::string& reason) const {
    if (options_.error_response) return options_.error_response(status, reason);
    return Response{status, "text/plain; charset=utf-8", reason + "\n", {}};
  }

  Counters counters_;
  std::atomic<bool> stopped_{false};
  const DoorOptions options_;
  const Handler handler_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;         // used on the event loop only, after Bind
  net::steady_timer retry_timer_;  // accepting again after a failure (out of descriptors)
  net::thread_pool pool_;          // runs handlers
  const size_t max_connections_;
  int port_ = 0;
};

namespace {

// One answer in progress. Touched on its connection's strand, except the atomics.
struct Answer {
  bool keep_alive = true;
  unsigned version = 11;
  bool streaming = false;
  bool head_sent = false;      // a stream's head is written: chunks may follow
  bool writing = false;        // a write is in flight
  bool end_requested = false;  // End() came: the last chunk follows the queue
  bool finished = false;       // fully written, or abandoned
  std::deque<std::string> queue;
  std::function<void()> on_writable;
  // What Hold() keeps alive, owned by the pending wait of `keeper` (never by the answer: what
  // is held usually holds the exchange, hence this answer). Cancelling the wait releases it;
  // so does the event loop's destruction when the door stops with the answer unfinished.
  std::weak_ptr<std::vector<std::shared_ptr<void>>> held;
  std::unique_ptr<net::steady_timer> keeper;
  std::atomic<bool> gone{false};
  std::atomic<size_t> backlog{0};
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpDoor::Impl* door, tcp::socket socket) : door_(door), stream_(std::move(socket)) {
    ++door_->counters_.open;
  }
  ~Session() { --door_->counters_.open; }

  void Start() { WaitForRequest(); }

  // The answer path, on the strand (ExchangeImpl posts here).
  void SendWhole(const std::shared_ptr<Answer>& a, Response r);
  void SendHead(const std::shared_ptr<Answer>& a, Response r);
  void Enqueue(const std::shared_ptr<Answer>& a, std::string data);
  void SendEnd(const std::shared_ptr<Answer>& a);
  void Abandon(const std::shared_ptr<Answer>& a);  // the exchange went away mid-stream
  void Keep(const std::shared_ptr<Answer>& a, std::shared_ptr<void> owned);  // Hold()
  void Release(const std::shared_ptr<Answer>& a);  // drops what Keep() kept
  // The connection's strand: what runs there runs one at a time.
  beast::tcp_stream::executor_type strand() { return stream_.get_executor(); }
  HttpDoor::Impl* door() const { return door_; }

 private:
  void WaitForRequest();
  void ReadHeader();
  void ReadBody();
  void OnReadError(beast::error_code ec);
  void Dispatch();
  // While `a` is being prepared: the client closing the connection (EOF or reset) makes it gone.
  void WatchForClose(const std::shared_ptr<Answer>& a);
  void Flush(const std::shared_ptr<Answer>& a);
  void Finish(const std::shared_ptr<Answer>& a);  // written: next request or close
  void Gone(const std::shared_ptr<Answer>& a, beast::error_code ec);
  void Linger();  // drops what the client still sends until it closes or the linger time ends
  void Close();

  template <class Body>
  void ApplyHead(const Response& r, const std::shared_ptr<Answer>& a,
                 http::response<Body>* out) const {
    out->result(static_cast<unsigned>(r.status));
    out->version(a->version);
    for (const auto& [name, value] : r.headers) out->set(name, value);
    if (!r.content_type.empty()) out->set(http::field::content_type, r.content_type);
    out->keep_alive(a->keep_alive);
  }

  HttpDoor::Impl* door_;  // outlives the session
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Clock::time_point request_deadline_;
};

class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<Session> session, std::shared_ptr<Answer> answer)
      : session_(std::move(session)), answer_(std::move(answer)) {}

  ~ExchangeImpl() override {
    // While the door shuts down (its loop's queue being destroyed) nothing is posted.
    if (session_->door()->stopped_.load()) return;
    if (!answered_.exchange(true)) {
      Post([s = session_, a = answer_,
            r = session_->door()->ErrorResponse(500, "the request was not answered")]() mutable {
        s->SendWhole(a, std::move(r));
      });
    } else if (answer_->streaming && !ended_.load()) {
      Post([s = session_, a = answer_] { s->Abandon(a); });
    }
  }

  void Respond(Response response) override {
    if (answered_.exchange(true)) return;
    Post([s = session_, a = answer_, r = std::move(response)]() mutable {
      s->SendWhole(a, std::move(r));
    });
  }
  void BeginStream(Response head) override {
    if (answered_.exchange(true)) return;
    answer_->streaming = true;  // read by ~ExchangeImpl on this side only
    Post([s = session_, a = answer_, r = std::move(head)]() mutable {
      s->SendHead(a, std::move(r));
    });
  }
  bool Write(std::string data) override {
    if (answer_->gone.load()) return false;
    if (data.empty()) return true;
    answer_->backlog += data.size();
    Post([s = session_, a = answer_, d = std::move(data)]() mutable {
      s->Enqueue(a, std::move(d));
    });
    return true;
  }
  void End() override {
    if (ended_.exchange(true)) return;
    Post([s = session_, a = answer_] { s->SendEnd(a); });
  }
  bool gone() const override { return answer_->gone.load(); }
  size_t backlog_bytes() const override { return answer_->backlog.load(); }
  void OnWritable(std::function<void()> fn) override {
    Post([a = answer_, fn = std::move(fn)]() mutable {
      if (a->gone.load()) {
        fn();  // gone before the listener came: it still hears of it once
        return;
      }
      a->on_writable = std::move(fn);
    });
  }
  void Hold(std::shared_ptr<void> owned) override {
    Post([s = session_, a = answer_, o = std::move(owned)]() mutable {
      if (!a->finished) s->Keep(a, std::move(o));
    });
  }
  void Schedule(std::function<void()> fn, Clock::time_point at) override {
    if (at == Clock::time_point{} || at <= Clock::now()) {
      Post(std::move(fn));
      return;
    }
    auto timer = std::make_shared<net::steady_timer>(session_->strand(), at);
    timer->async_wait([timer, fn = std::move(fn)](beast::error_code) { fn(); });
  }

 private:
  template <class Fn>
  void Post(Fn&& fn) {
    net::post(session_->strand(), std::forward<Fn>(fn));
  }

  std::shared_ptr<Session> session_;
  std::shared_ptr<Answer> answer_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> ended_{false};
};

void Session::WaitForRequest() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(door_->options_.max_header_bytes));
  parser_->body_limit(door_->options_.max_body_bytes);
  if (buffer_.size() > 0) {  // a pipelined request already began
    request_deadline_ = Clock::now() + Seconds(door_->options_.request_timeout_s);
    ReadHeader();
    return;
  }
  // Idle until the first byte: a thread-free wait, closed at the idle deadline.
  stream_.expires_after(Seconds(door_->options_.idle_timeout_s));
  stream_.async_read_some(
      buffer_.prepare(1024), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (ec) {
          if (ec == beast::error::timeout) ++self->door_->counters_.idle_timeouts;
          self->Close();
          return;
        }
        self->buffer_.commit(n);
        self->request_deadline_ = Clock::now() + Seconds(self->door_->options_.request_timeout_s);
        self->ReadHeader();
      });
}

void Session::ReadHeader() {
  stream_.expires_at(request_deadline_);
  http::async_read_header(
      stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) {
          self->OnReadError(ec);
          return;
        }
        const auto& head = self->parser_->get();
        if (beast::iequals(head[http::field::expect], "100-continue") &&
            !self->parser_->is_done()) {
          auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                         head.version());
          http::async_write(self->stream_, *cont, [self, cont](beast::error_code wec, size_t) {
            if (wec) {
              self->Close();
              return;
            }
            self->ReadBody();
          });
          return;
        }
        self->ReadBody();
      });
}

void Session::ReadBody() {
  if (parser_->is_done()) {
    Dispatch();
    return;
  }
  stream_.expires_at(request_deadline_);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     if (ec) {
                       self->OnReadError(ec);
                       return;
                     }
                     self->Dispatch();
                   });
}

void Session::OnReadError(beast::error_code ec) {
  if (ec == beast::error::timeout) {
    ++door_->counters_.request_timeouts;
    Close();
    return;
  }
  int status = 0;
  std::string reason;
  if (ec == http::error::header_limit) {
    status = 431;
    reason = "the request's headers are larger than the limit of " +
             std::to_string(door_->options_.max_header_bytes) + " bytes";
  } else if (ec == http::error::body_limit) {
    status = 413;
    reason = "the request body is larger than the limit of " +
             std::to_string(door_->options_.max_body_bytes) + " bytes";
  } else if (ec.category() == beast::error_code(http::error::bad_method).category() &&
             ec != http::error::end_of_stream && ec != http::error::partial_message) {
    status = 400;
    reason = "the request could not be read: " + ec.message();
  }
  if (status == 0) {  // the client closed or reset the connection
    Close();
    return;
  }
  ++door_->counters_.bad_requests;
  auto a = std::make_shared<Answer>();
  a->keep_alive = false;  // the stream's framing is lost
  SendWhole(a, door_->ErrorResponse(status, reason));
}

void Session::Dispatch() {
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();
  stream_.expires_never();
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& field : msg) {
    req.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  req.body = std::move(msg.body());
  auto a = std::make_shared<Answer>();
  a->keep_alive = msg.keep_alive() && !door_->stopped_.load();
  a->version = msg.version();
  ++door_->counters_.requests;
  WatchForClose(a);
  auto exchange = std::make_shared<ExchangeImpl>(shared_from_this(), a);
  net::post(door_->pool_, [door = door_, req = std::move(req), exchange]() mutable {
    try {
      door->handler_(std::move(req), exchange);
    } catch (const std::exception& e) {
      exchange->Respond(door->ErrorResponse(500, std::string("internal error: ") + e.what()));
    } catch (...) {
      exchange->Respond(door->ErrorResponse(500, "internal error"));
    }
  });
}

void Session::WatchForClose(const std::shared_ptr<Answer>& a) {
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this(), a](beast::error_code ec) {
        if (a->finished || a->gone.load() || ec == net::error::operation_aborted) return;
        char byte;
        beast::error_code peek_ec;
        const size_t n = ec ? 0
                            : self->stream_.socket().receive(net::buffer(&byte, 1),
                                                             tcp::socket::message_peek, peek_ec);
        // Bytes of a next (pipelined) request: leave them for after this answer and stop
        // watching. Nothing (EOF) or an error (a reset): the client is gone.
        if (!ec && !peek_ec && n > 0) return;
        ++self->door_->counters_.client_closes;
        self->Gone(a, ec ? ec : peek_ec);
      });
}

void Session::SendWhole(const std::shared_ptr<Answer>& a, Response r) {
  if (a->gone.load()) return;
  auto res = std::make_shared<http::response<http::string_body>>();
  ApplyHead(r, a, res.get());
  res->body() = std::move(r.body);
  res->prepare_payload();
  a->writing = true;
  stream_.expires_after(Seconds(door_->options_.write_timeout_s));
  http::async_write(stream_, *res,
                    [self = shared_from_this(), a, res](beast::error_code ec, size_t) {
                      a->writing = false;
                      if (ec) {
                        self->Gone(a, ec);
                        return;
                      }
                      self->Finish(a);
                    });
}

void Session::SendHead(const std::shared_ptr<Answer>& a, Response r) {
  auto res = std::make_shared<http::response<http::empty_body>>();
  ApplyHead(r, a, res.get());
  res->chunked(true);
  auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*res);
  a->writing = true;
  stream_.expires_after(Seconds(door_->options_.write_timeout_s));
  http::async_write_header(
      stream_, *serializer,
      [self = shared_from_this(), a, res, serializer](beast::error_code ec, size_t) {
        a->writing = false;
        if (ec) {
          self->Gone(a, ec);
          return;
        }
        a->head_sent = true;
        self->Flush(a);
      });
}

void Session::Enqueue(const std::shared_ptr<Answer>& a, std::string data) {
  if (a->gone.load() || a->finished) {
    a->backlog -= data.size();
    return;
  }
  a->queue.push_back(std::move(data));
  Flush(a);
}

void Session::SendEnd(const std::shared_ptr<Answer>& a) {
  a->end_requested = true;
  Flush(a);
}

void Session::Abandon(const std::shared_ptr<Answer>& a) {
  if (a->finished || a->end_requested) return;
  // An unfinished chunked answer cannot be ended cleanly: the client sees the connection close.
  Gone(a, beast::error_code());
}

void Session::Flush(const std::shared_ptr<Answer>& a) {
  if (!a->head_sent || a->writing || a->gone.load() || a->finished) return;
  if (a->queue.empty()) {
    if (!a->end_requested) return;
    a->writing = true;
    stream_.expires_after(Seconds(door_->options_.write_timeout_s));
    net::async_write(stream_, http::make_chunk_last(),
                     [self = shared_from_this(), a](beast::error_code ec, size_t) {
                       a->writing = false;
                       if (ec) {
                         self->Gone(a, ec);
                         return;
                       }
                       self->Finish(a);
                     });
    return;
  }
  auto chunk = std::make_shared<std::string>(std::move(a->queue.front()));
  a->queue.pop_front();
  while (!a->queue.empty() && chunk->size() + a->queue.front().size() <= kMaxChunkBytes) {
    *chunk += a->queue.front();
    a->queue.pop_front();
  }
  a->writing = true;
  stream_.expires_after(Seconds(door_->options_.write_timeout_s));
  net::async_write(stream_, http::make_chunk(net::buffer(*chunk)),
                   [self = shared_from_this(), a, chunk](beast::error_code ec, size_t) {
                     a->writing = false;
                     a->backlog -= chunk->size();
                     if (ec) {
                       self->Gone(a, ec);
                       return;
                     }
                     if (a->queue.empty() && a->on_writable) a->on_writable();
                     self->Flush(a);
                   });
}

void Session::Keep(const std::shared_ptr<Answer>& a, std::shared_ptr<void> owned) {
  auto held = a->held.lock();
  if (!held) {
    held = std::make_shared<std::vector<std::shared_ptr<void>>>();
    a->held = held;
    a->keeper = std::make_unique<net::steady_timer>(stream_.get_executor());
    a->keeper->expires_after(std::chrono::hours(24 * 365));
    a->keeper->async_wait([held](beast::error_code) {});
  }
  held->push_back(std::move(owned));
}

void Session::Release(const std::shared_ptr<Answer>& a) {
  if (a->keeper) a->keeper->cancel();
}

void Session::Finish(const std::shared_ptr<Answer>& a) {
  a->finished = true;
  Release(a);
  a->on_writable = nullptr;
  if (a->keep_alive && !door_->stopped_.load()) {
    WaitForRequest();
  } else {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    // Closing with unread bytes would reset the connection and could destroy the answer
    // before the client read it (a 413 while it still sends its body): read and drop what
    // still comes, for a short while.
    stream_.expires_after(kLingerTime);
    Linger();
  }
}

void Session::Linger() {
  buffer_.clear();
  stream_.async_read_some(buffer_.prepare(16 << 10),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) {
                              self->Close();
                              return;
                            }
                            self->Linger();
                          });
}

void Session::Gone(const std::shared_ptr<Answer>& a, beast::error_code ec) {
  if (ec == beast::error::timeout) ++door_->counters_.write_timeouts;
  if (a->gone.exchange(true)) return;
  a->finished = true;
  a->queue.clear();
  std::function<void()> notify = std::move(a->on_writable);
  a->on_writable = nullptr;
  if (notify) notify();
  Release(a);
  Close();
}

void Session::Close() {
  beast::error_code ec;
  stream_.socket().close(ec);
}

}  // namespace

Status HttpDoor::Impl::Bind() {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options_.host, ec);
  if (ec) return Unavailable("cannot listen on '" + options_.host + "': " + ec.message());
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    acceptor_.close(ignored);
    return Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  return OkStatus();
}

void HttpDoor::Impl::Accept() {
  acceptor_.async_accept(
      net::make_strand(ioc_), [self = this](beast::error_code ec, tcp::socket s) {
        if (self->stopped_.load() || ec == net::error::operation_aborted) return;
        if (ec) {
          // Out of descriptors (or a transient error): try again shortly rather than spin.
          self->retry_timer_.expires_after(std::chrono::milliseconds(50));
          self->retry_timer_.async_wait([self](beast::error_code wec) {
            if (!wec) self->Accept();
          });
          return;
        }
        ++self->counters_.accepted;
        if (static_cast<size_t>(self->counters_.open.load()) >= self->max_connections_) {
          ++self->counters_.refused;
          beast::error_code ignored;
          s.close(ignored);
        } else {
          std::make_shared<Session>(self, std::move(s))->Start();
        }
        self->Accept();
      });
}

void HttpDoor::Impl::Run() {
  const int extra = std::max(1, options_.io_threads) - 1;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(extra));
  for (int i = 0; i < extra; ++i) threads.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (std::thread& t : threads) t.join();
  beast::error_code ignored;
  acceptor_.close(ignored);  // the loop has stopped: no handler touches it now
}

void HttpDoor::Impl::Stop() {
  stopped_.store(true);
  ioc_.stop();
}

size_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return static_cast<size_t>(limit.rlim_cur);
}

HttpDoor::HttpDoor(DoorOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpDoor::~HttpDoor() {
  impl_->Stop();
  // Handlers still running finish first; the event loop's objects go with the last exchange.
  impl_->pool_.join();
}

Status HttpDoor::Bind() { return impl_->Bind(); }
int HttpDoor::port() const { return impl_->port_; }
size_t HttpDoor::max_connections() const { return impl_->max_connections_; }
void HttpDoor::Run() { impl_->Run(); }
void HttpDoor::Stop() { impl_->Stop(); }

DoorStats HttpDoor::Stats() const {
  const Counters& c = impl_->counters_;
  DoorStats s;
  s.connections_open = c.open.load();
  s.connections_accepted = c.accepted.load();
  s.connections_refused = c.refused.load();
  s.idle_timeouts = c.idle_timeouts.load();
  s.request_timeouts = c.request_timeouts.load();
  s.write_timeouts = c.write_timeouts.load();
  s.bad_requests = c.bad_requests.load();
  s.requests = c.requests.load();
  s.client_closes = c.client_closes.load();
  return s;
}

}  // namespace tandem::http_door
