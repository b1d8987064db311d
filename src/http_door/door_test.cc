// HttpDoor over real sockets: answers whole and streamed, keep-alive, the door's own refusals
// (400, 413, 431), its deadlines (idle, slow request, unread answer), "Expect: 100-continue",
// and the property it exists for: hundreds of silent connections do not keep a fresh request
// from being answered.
#include "http_door/door.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace tandem::http_door {
namespace {

using namespace std::chrono_literals;

// A client socket; closed when it goes out of scope.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  RawClient(RawClient&& o) noexcept : fd_(o.fd_), connected_(o.connected_) { o.fd_ = -1; }

  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  bool Send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Reads until `until` appears, the peer closes, or `timeout` passes; returns what came.
  std::string ReadUntil(const std::string& until, std::chrono::milliseconds timeout) {
    std::string got;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (got.find(until) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left <= 0ms) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  // Whether the peer closed the connection within `timeout`.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    ReadUntil("\x01never\x02", timeout);
    return closed_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

class DoorTest : public ::testing::Test {
 protected:
  void Start(DoorOptions options, Handler handler) {
    door_ = std::make_unique<HttpDoor>(std::move(options), std::move(handler));
    ASSERT_TRUE(door_->Bind().ok());
    thread_ = std::thread([this] { door_->Run(); });
  }
  void TearDown() override {
    if (door_) door_->Stop();
    if (thread_.joinable()) thread_.join();
    door_.reset();
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", door_->port());
    c.set_read_timeout(10, 0);
    return c;
  }

  std::unique_ptr<HttpDoor> door_;
  std::thread thread_;
};

// Echoes the method, path, one header and the body.
void Echo(Request req, std::shared_ptr<Exchange> ex) {
  ex->Respond({200,
               "text/plain",
               req.method + " " + req.path + " " + req.Header("x-tag") + " " + req.body,
               {{"X-Door", "yes"}}});
}

TEST_F(DoorTest, AnswersWholeRequestsOnAKeptAliveConnection) {
  Start({}, Echo);
  httplib::Client c = Client();
  c.set_keep_alive(true);
  auto get = c.Get("/a/b?q=1", httplib::Headers{{"X-Tag", "t1"}});
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "GET /a/b t1 ");
  EXPECT_EQ(get->get_header_value("X-Door"), "yes");
  EXPECT_EQ(get->get_header_value("Content-Type"), "text/plain");
  auto post = c.Post("/p", "hello body", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->body, "POST /p  hello body");
  EXPECT_EQ(door_->Stats().connections_accepted, 1);  // both on one connection
  EXPECT_EQ(door_->Stats().requests, 2);
}

TEST_F(DoorTest, StreamsChunksWrittenFromAnotherThread) {
  std::vector<std::thread> writers;
  std::mutex mu;
  Start({}, [&](Request, std::shared_ptr<Exchange> ex) {
    ex->BeginStream({200, "text/event-stream", "", {{"Cache-Control", "no-cache"}}});
    std::lock_guard<std::mutex> lock(mu);
    writers.emplace_back([ex] {
      for (int i = 0; i < 5; ++i) {
        std::this_thread::sleep_for(10ms);
        EXPECT_TRUE(ex->Write("data: " + std::to_string(i) + "\n\n"));
      }
      ex->End();
    });
  });
  httplib::Client c = Client();
  std::string got;
  auto res = c.Get("/s", [&](const char* data, size_t n) {
    got.append(data, n);
    return true;
  });
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Transfer-Encoding"), "chunked");
  EXPECT_EQ(got, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  std::lock_guard<std::mutex> lock(mu);
  for (std::thread& t : writers) t.join();
}

TEST_F(DoorTest, PiecesWrittenBeforeTheHeadFollowIt) {
  Start({}, [](Request, std::shared_ptr<Exchange> ex) {
    ex->Write("one ");
    ex->Write("two");
    ex->BeginStream({200, "text/plain", "", {}});
    ex->End();
  });
  auto res = Client().Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "one two");
}

TEST_F(DoorTest, SilentConnectionsDoNotHoldBackAFreshRequest) {
  DoorOptions o;
  o.handler_threads = 2;
  o.idle_timeout_s = 120;
  o.request_timeout_s = 120;
  Start(o, Echo);
  // Far more silent clients than handler threads: half a request header each, or nothing.
  std::vector<RawClient> silent;
  for (int i = 0; i < 400; ++i) {
    silent.emplace_back(door_->port());
    ASSERT_TRUE(silent.back().connected());
    if (i % 2 == 0) {
      ASSERT_TRUE(silent.back().Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
    }
  }
  httplib::Client c = Client();
  auto res = c.Get("/fresh");
  ASSERT_TRUE(res) << "a fresh request got no answer while 400 connections were silent";
  EXPECT_EQ(res->body, "GET /fresh  ");
  EXPECT_GE(door_->Stats().connections_open, 400);
}

TEST_F(DoorTest, DeadlinesCloseIdleAndSlowConnections) {
  DoorOptions o;
  o.idle_timeout_s = 0.2;
  o.request_timeout_s = 0.4;
  Start(o, Echo);
  RawClient idle(door_->port());
  EXPECT_TRUE(idle.ClosedWithin(5000ms));
  RawClient slow(door_->port());
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\n"));
  // Keeps sending header bytes slowly, never finishing: the request deadline ends it.
  bool closed = false;
  for (int i = 0; i < 50 && !closed; ++i) {
    slow.Send("X-Slow: 1\r\n");
    closed = slow.ClosedWithin(100ms);
  }
  EXPECT_TRUE(closed);
  // The timer closes the socket before the read's handler counts the timeout (on the door's
  // thread): the count follows the close shortly, so wait for it.
  DoorStats s = door_->Stats();
  for (auto until = std::chrono::steady_clock::now() + 2s;
       s.request_timeouts == 0 && std::chrono::steady_clock::now() < until; s = door_->Stats()) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(s.idle_timeouts, 1);
  EXPECT_EQ(s.request_timeouts, 1) << "idle " << s.idle_timeouts << " bad " << s.bad_requests
                                   << " accepted " << s.connections_accepted;
  EXPECT_EQ(s.requests, 0);
}

TEST_F(DoorTest, RefusesUnreadableAndOversizedRequests) {
  DoorOptions o;
  o.max_header_bytes = 1024;
  o.max_body_bytes = 100;
  o.error_response = [](int status, const std::string& reason) {
    return Response{status, "application/json", "{\"error\":\"" + reason + "\"}", {}};
  };
  Start(o, Echo);
  httplib::Client c = Client();
  auto big_body = c.Post("/p", std::string(101, 'x'), "text/plain");
  ASSERT_TRUE(big_body);
  EXPECT_EQ(big_body->status, 413);
  EXPECT_NE(big_body->body.find("larger than the limit of 100 bytes"), std::string::npos);
  auto big_header = c.Get("/h", httplib::Headers{{"X-Big", std::string(2000, 'y')}});
  ASSERT_TRUE(big_header);
  EXPECT_EQ(big_header->status, 431);
  RawClient garbage(door_->port());
  ASSERT_TRUE(garbage.Send("NOT HTTP AT ALL\r\n\r\n"));
  const std::string answer = garbage.ReadUntil("}", 5000ms);
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
  EXPECT_EQ(door_->Stats().bad_requests, 3);
  // The door still serves.
  auto ok = c.Post("/p", "small", "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(DoorTest, AnswersExpectContinueBeforeTheBody) {
  Start({}, Echo);
  RawClient client(door_->port());
  ASSERT_TRUE(client.Send(
      "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  const std::string interim = client.ReadUntil("\r\n\r\n", 5000ms);
  EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue", 0), 0u) << interim;
  ASSERT_TRUE(client.Send("abcde"));
  const std::string answer = client.ReadUntil("abcde", 5000ms);
  EXPECT_NE(answer.find("HTTP/1.1 200"), std::string::npos) << answer;
  EXPECT_NE(answer.find("POST /e  abcde"), std::string::npos) << answer;
}

TEST_F(DoorTest, AnUnansweredRequestGets500AndAThrowingHandlerToo) {
  Start({}, [](Request req, std::shared_ptr<Exchange>) {
    if (req.path == "/throw") throw std::runtime_error("boom");
  });
  httplib::Client c = Client();
  auto dropped = c.Get("/drop");
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->status, 500);
  auto thrown = c.Get("/throw");
  ASSERT_TRUE(thrown);
  EXPECT_EQ(thrown->status, 500);
  EXPECT_NE(thrown->body.find("boom"), std::string::npos);
}

TEST_F(DoorTest, AClientThatGoesAwayMidStreamIsNoticed) {
  std::shared_ptr<Exchange> kept;
  std::atomic<bool> notified{false};
  std::mutex mu;
  Start({}, [&](Request, std::shared_ptr<Exchange> ex) {
    ex->OnWritable([&notified, ex] {
      if (ex->gone()) notified = true;
    });
    ex->BeginStream({200, "text/plain", "", {}});
    ex->Write("first\n");
    std::lock_guard<std::mutex> lock(mu);
    kept = ex;
  });
  {
    RawClient client(door_->port());
    ASSERT_TRUE(client.Send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_NE(client.ReadUntil("first", 5000ms).find("first"), std::string::npos);
  }  // closed
  std::shared_ptr<Exchange> ex;
  {
    std::lock_guard<std::mutex> lock(mu);
    ex = kept;
  }
  ASSERT_NE(ex, nullptr);
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    refused = !ex->Write(std::string(64 << 10, 'z'));
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(refused);
  EXPECT_TRUE(ex->gone());
  for (int i = 0; i < 100 && !notified; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(notified);
  std::lock_guard<std::mutex> lock(mu);
  kept.reset();
}

TEST_F(DoorTest, AClientThatClosesBeforeItsAnswerIsNoticed) {
  std::shared_ptr<Exchange> kept;
  std::atomic<bool> notified{false};
  std::mutex mu;
  Start({}, [&](Request, std::shared_ptr<Exchange> ex) {
    std::weak_ptr<Exchange> weak = ex;
    ex->OnWritable([&notified, weak] {
      if (auto e = weak.lock(); e && e->gone()) notified = true;
    });
    std::lock_guard<std::mutex> lock(mu);
    kept = ex;  // no answer yet: the work behind it goes on
  });
  for (bool half_close : {false, true}) {
    SCOPED_TRACE(half_close);
    notified = false;
    {
      RawClient client(door_->port());
      ASSERT_TRUE(client.Send("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"));
      for (int i = 0; i < 200; ++i) {
        std::lock_guard<std::mutex> lock(mu);
        if (kept) break;
        std::this_thread::sleep_for(5ms);
      }
      if (half_close) {
        ASSERT_EQ(::shutdown(client.fd(), SHUT_WR), 0);
        std::this_thread::sleep_for(300ms);  // while the socket stays open
      }
    }  // closed
    std::shared_ptr<Exchange> ex;
    {
      std::lock_guard<std::mutex> lock(mu);
      ex = std::move(kept);
    }
    ASSERT_NE(ex, nullptr);
    for (int i = 0; i < 200 && !notified; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(notified);
    EXPECT_TRUE(ex->gone());
    ex->Respond({200, "text/plain", "too late", {}});  // dropped, no crash
  }
  EXPECT_EQ(door_->Stats().client_closes, 2);
}

TEST_F(DoorTest, PipelinedRequestsAreNotMistakenForAClose) {
  Start({}, [](Request req, std::shared_ptr<Exchange> ex) {
    std::this_thread::sleep_for(100ms);  // the second request is in the socket meanwhile
    Echo(std::move(req), std::move(ex));
  });
  RawClient client(door_->port());
  ASSERT_TRUE(
      client.Send("GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string got = client.ReadUntil("GET /two", 5000ms);
  EXPECT_NE(got.find("GET /one"), std::string::npos) << got;
  EXPECT_NE(got.find("GET /two"), std::string::npos) << got;
  EXPECT_EQ(door_->Stats().client_closes, 0);
}

TEST_F(DoorTest, ConnectionsBeyondTheLimitAreClosed) {
  DoorOptions o;
  o.max_connections = 2;
  Start(o, Echo);
  RawClient a(door_->port()), b(door_->port());
  for (int i = 0; i < 100 && door_->Stats().connections_open < 2; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  RawClient c(door_->port());
  EXPECT_TRUE(c.ClosedWithin(5000ms));
  EXPECT_EQ(door_->Stats().connections_refused, 1);
  ASSERT_TRUE(a.Send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(a.ReadUntil("GET /x", 5000ms).find("200"), std::string::npos);
}

TEST_F(DoorTest, ScheduledFunctionsRunInOrderAndAtTheirTime) {
  std::atomic<int> ran{0};
  std::vector<int> order;
  std::mutex mu;
  Start({}, [&](Request, std::shared_ptr<Exchange> ex) {
    const auto t0 = std::chrono::steady_clock::now();
    ex->Schedule(
        [&, ex, t0] {
          {
            std::lock_guard<std::mutex> lock(mu);
            order.push_back(2);
            EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
          }
          ex->Respond({200, "text/plain", "late", {}});
        },
        t0 + 100ms);
    ex->Schedule([&] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(1);
    });
  });
  httplib::Client c = Client();
  auto res = c.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "late");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace tandem::http_door
