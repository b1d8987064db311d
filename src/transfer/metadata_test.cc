// The metadata service: one behavioural suite run over the embedded store, the HTTP store
// (against an in-process MetadataHttpServer) and the etcd store (against a real etcd started
// by the fixture); lease expiry of a SIGKILLed client; URI parsing, timeouts and the HTTP
// server's protocol.
#include "transfer/metadata.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "transfer/etcd_test_process.h"
#include "transfer/metadata_http_protocol_internal.h"
#include "transfer/metadata_internal.h"

namespace tandem::transfer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using KVs = std::vector<std::pair<std::string, std::string>>;

enum class Backend { kEmbedded, kHttp, kEtcd };

// Names the backend in test listings (ctest shows GetParam() through this).
void PrintTo(Backend b, std::ostream* os) {
  *os << (b == Backend::kEmbedded ? "embedded" : b == Backend::kHttp ? "http" : "etcd");
}

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kEmbedded: return "Embedded";
    case Backend::kHttp: return "Http";
    case Backend::kEtcd: return "Etcd";
  }
  return "Unknown";
}

// Short leases keep the expiry tests fast; 1 s is etcd's minimum with the fixture's settings.
MetadataOptions TestOptions() {
  MetadataOptions o;
  o.ttl = milliseconds(1000);
  o.timeout = milliseconds(2000);
  return o;
}

// Polls until `key` is NotFound or `within` passes; returns how long it took (or `within`).
milliseconds WaitUntilGone(MetadataStore& store, const std::string& key, milliseconds within) {
  const auto start = Clock::now();
  while (Clock::now() - start < within) {
    if (store.Get(key).status().code() == StatusCode::kNotFound) {
      return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return within;
}

class MetadataStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  static void TearDownTestSuite() {
    http_server_.reset();
    etcd_.reset();
  }

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // Tests in one process share a server: each writes under its own prefix.
    prefix_ = std::string("/test/") + info->name() + "/";
    switch (GetParam()) {
      case Backend::kEmbedded: uri_ = std::string("embedded:") + info->name(); break;
      case Backend::kHttp:
        if (!http_server_) {
          auto server = MetadataHttpServer::Start("127.0.0.1", 0);
          ASSERT_TRUE(server.ok()) << server.status().ToString();
          http_server_ = std::move(*server);
        }
        uri_ = "http://127.0.0.1:" + std::to_string(http_server_->port());
        break;
      case Backend::kEtcd:
        if (!etcd_) {
          auto etcd = testing::EtcdProcess::Start();
          ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
          etcd_ = std::move(*etcd);
        }
        uri_ = etcd_->uri();
        break;
    }
  }

  std::shared_ptr<MetadataStore> Open() {
    auto store = OpenMetadataStore(uri_, TestOptions());
    EXPECT_TRUE(store.ok()) << uri_ << ": " << store.status().ToString();
    return store.ok() ? *store : nullptr;
  }

  static inline std::unique_ptr<MetadataHttpServer> http_server_;
  static inline std::unique_ptr<testing::EtcdProcess> etcd_;
  std::string uri_;
  std::string prefix_;
};

// The lease tests: only the remote backends have leases (an embedded store lives and dies with
// its process).
class RemoteMetadataStoreTest : public MetadataStoreTest {};

TEST_P(MetadataStoreTest, PutGetOverwrite) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string key = prefix_ + "seg";
  ASSERT_TRUE(store->Put(key, "first").ok());
  auto v = store->Get(key);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "first");
  ASSERT_TRUE(store->Put(key, "second").ok());
  v = store->Get(key);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "second");
}

TEST_P(MetadataStoreTest, MissingKeyIsNotFound) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto v = store->Get(prefix_ + "absent");
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound) << v.status().ToString();
}

TEST_P(MetadataStoreTest, DeleteRemovesOnlyThatKey) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(prefix_ + "a", "1").ok());
  ASSERT_TRUE(store->Put(prefix_ + "b", "2").ok());
  ASSERT_TRUE(store->Delete(prefix_ + "a").ok());
  EXPECT_EQ(store->Get(prefix_ + "a").status().code(), StatusCode::kNotFound);
  auto b = store->Get(prefix_ + "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "2");
  // Deleting a missing key is not an error.
  EXPECT_TRUE(store->Delete(prefix_ + "a").ok());
}

TEST_P(MetadataStoreTest, ListByPrefixIsSortedAndExact) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  // Written out of order; "seg/a" is a prefix of "seg/ab", and "seg" of "segment".
  ASSERT_TRUE(store->Put(prefix_ + "seg/b", "3").ok());
  ASSERT_TRUE(store->Put(prefix_ + "segment", "4").ok());
  ASSERT_TRUE(store->Put(prefix_ + "seg/ab", "2").ok());
  ASSERT_TRUE(store->Put(prefix_ + "seg/a", "1").ok());
  ASSERT_TRUE(store->Put(prefix_ + "other", "5").ok());

  auto all = store->List(prefix_ + "seg/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all,
            (KVs{{prefix_ + "seg/a", "1"}, {prefix_ + "seg/ab", "2"}, {prefix_ + "seg/b", "3"}}));

  auto a = store->List(prefix_ + "seg/a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (KVs{{prefix_ + "seg/a", "1"}, {prefix_ + "seg/ab", "2"}}));

  auto seg = store->List(prefix_ + "seg");
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(seg->size(), 4u);
  EXPECT_EQ(seg->back(), (std::pair<std::string, std::string>{prefix_ + "segment", "4"}));

  auto none = store->List(prefix_ + "zzz");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // The empty prefix lists everything, this test's keys included.
  auto every = store->List("");
  ASSERT_TRUE(every.ok());
  EXPECT_GE(every->size(), 5u);
  EXPECT_TRUE(std::is_sorted(every->begin(), every->end()));
}

TEST_P(MetadataStoreTest, BinaryKeysAndValuesRoundTrip) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string key = prefix_ + std::string("bin\xff\x01", 5);
  const std::string value("\x00\xff\xfe{\"\n", 6);
  ASSERT_TRUE(store->Put(key, value).ok());
  auto v = store->Get(key);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, value);
  auto listed = store->List(prefix_ + "bin\xff");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, (KVs{{key, value}}));
  // An empty value is a value.
  ASSERT_TRUE(store->Put(prefix_ + "empty", "").ok());
  auto e = store->Get(prefix_ + "empty");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, "");
}

TEST_P(MetadataStoreTest, TwoClientsSeeEachOthersKeys) {
  auto a = Open();
  auto b = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Put(prefix_ + "from_a", "A").ok());
  ASSERT_TRUE(b->Put(prefix_ + "from_b", "B").ok());
  auto seen_by_b = b->Get(prefix_ + "from_a");
  ASSERT_TRUE(seen_by_b.ok());
  EXPECT_EQ(*seen_by_b, "A");
  auto listed_by_a = a->List(prefix_);
  ASSERT_TRUE(listed_by_a.ok());
  EXPECT_EQ(*listed_by_a, (KVs{{prefix_ + "from_a", "A"}, {prefix_ + "from_b", "B"}}));
  // Either may delete the other's key.
  ASSERT_TRUE(a->Delete(prefix_ + "from_b").ok());
  EXPECT_EQ(b->Get(prefix_ + "from_b").status().code(), StatusCode::kNotFound);
}

TEST_P(MetadataStoreTest, DestroyingAClientRemovesItsKeysAtOnce) {
  auto stays = Open();
  auto goes = Open();
  ASSERT_NE(stays, nullptr);
  ASSERT_NE(goes, nullptr);
  ASSERT_TRUE(stays->Put(prefix_ + "stays", "1").ok());
  ASSERT_TRUE(goes->Put(prefix_ + "goes/1", "2").ok());
  ASSERT_TRUE(goes->Put(prefix_ + "goes/2", "3").ok());
  // A key overwritten by `stays` now belongs to it.
  ASSERT_TRUE(goes->Put(prefix_ + "taken", "4").ok());
  ASSERT_TRUE(stays->Put(prefix_ + "taken", "5").ok());
  goes.reset();
  // No waiting: the lease was revoked (remote) or the keys dropped (embedded).
  auto left = stays->List(prefix_);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left, (KVs{{prefix_ + "stays", "1"}, {prefix_ + "taken", "5"}}));
}

TEST_P(MetadataStoreTest, DurableKeysOutliveTheirWriter) {
  auto reader = Open();
  auto writer = Open();
  ASSERT_NE(reader, nullptr);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->PutDurable(prefix_ + "durable", "d").ok());
  ASSERT_TRUE(writer->Put(prefix_ + "leased", "l").ok());
  // A leased key made durable by a later put is no longer the lease's.
  ASSERT_TRUE(writer->Put(prefix_ + "promoted", "1").ok());
  ASSERT_TRUE(writer->PutDurable(prefix_ + "promoted", "2").ok());
  writer.reset();  // its lease revoked (remote) or its keys dropped (embedded)
  auto left = reader->List(prefix_);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left, (KVs{{prefix_ + "durable", "d"}, {prefix_ + "promoted", "2"}}));
  // Gone only when deleted.
  ASSERT_TRUE(reader->Delete(prefix_ + "durable").ok());
  EXPECT_EQ(reader->Get(prefix_ + "durable").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reader->PutDurable("", "v").code(), StatusCode::kInvalidArgument);
}

TEST_P(MetadataStoreTest, EmptyKeyRefused) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Put("", "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Get("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Delete("").code(), StatusCode::kInvalidArgument);
}

TEST_P(RemoteMetadataStoreTest, KeysOutliveTheTtlWhileTheClientLives) {
  auto store = Open();
  auto reader = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(store->Put(prefix_ + "renewed", "x").ok());
  std::this_thread::sleep_for(TestOptions().ttl * 5 / 2);  // renewed about 7 times meanwhile
  auto v = reader->Get(prefix_ + "renewed");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "x");
}

// Forks a child that opens the store, puts `key`, reports through a pipe and sleeps. Returns
// its pid once the key is written, or -1.
pid_t SpawnWriter(const std::string& uri, const std::string& key) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    auto store = OpenMetadataStore(uri, TestOptions());
    if (!store.ok() || !(*store)->Put(key, "child").ok()) _exit(2);
    const char ready = 'r';
    if (write(fds[1], &ready, 1) != 1) _exit(3);
    while (true) pause();  // killed by the parent
  }
  close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  char c = 0;
  const bool ready = poll(&p, 1, 10000) == 1 && read(fds[0], &c, 1) == 1 && c == 'r';
  close(fds[0]);
  if (!ready) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

TEST_P(RemoteMetadataStoreTest, KeysOfAKilledClientExpireWithinTheTtl) {
  auto observer = Open();
  ASSERT_NE(observer, nullptr);
  const std::string key = prefix_ + "child";
  const pid_t pid = SpawnWriter(uri_, key);
  ASSERT_GT(pid, 0) << "the child did not write its key";
  auto v = observer->Get(key);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "child");

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  // Killed: no revoke. The key stays until the lease lapses (at least 2/3 TTL away).
  EXPECT_TRUE(observer->Get(key).ok());
  // Slack: a late last renewal and etcd's expiry sweep (every 500 ms).
  const milliseconds within = TestOptions().ttl + milliseconds(3000);
  const milliseconds took = WaitUntilGone(*observer, key, within);
  EXPECT_LT(took, within) << "the key of the killed client is still there";
  EXPECT_GT(took, milliseconds(100)) << "the key went before its lease could lapse";
}

TEST_P(RemoteMetadataStoreTest, StalledClientRewritesItsKeysUnderANewLease) {
  auto observer = Open();
  ASSERT_NE(observer, nullptr);
  const std::string key = prefix_ + "stalled";
  const pid_t pid = SpawnWriter(uri_, key);
  ASSERT_GT(pid, 0) << "the child did not write its key";
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  const milliseconds within = TestOptions().ttl + milliseconds(3000);
  EXPECT_LT(WaitUntilGone(*observer, key, within), within);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  // The child's renewer finds its lease gone, takes a new one and writes the key again.
  bool back = false;
  for (auto deadline = Clock::now() + milliseconds(3000); Clock::now() < deadline && !back;) {
    back = observer->Get(key).ok();
    if (!back) std::this_thread::sleep_for(milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(back) << "the resumed client did not write its key again";
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MetadataStoreTest,
                         ::testing::Values(Backend::kEmbedded, Backend::kHttp, Backend::kEtcd),
                         BackendName);

INSTANTIATE_TEST_SUITE_P(RemoteBackends, RemoteMetadataStoreTest,
                         ::testing::Values(Backend::kHttp, Backend::kEtcd), BackendName);

TEST(EmbeddedMetadataTest, NamesAreSeparateAndTheEmptyNameIsShared) {
  auto x = OpenMetadataStore("embedded:x-sep");
  auto y = OpenMetadataStore("embedded:y-sep");
  auto d1 = OpenMetadataStore("embedded:");
  auto d2 = OpenMetadataStore("embedded:");
  ASSERT_TRUE(x.ok() && y.ok() && d1.ok() && d2.ok());
  ASSERT_TRUE((*x)->Put("k", "in x").ok());
  EXPECT_EQ((*y)->Get("k").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE((*d1)->Put("default-k", "d").ok());
  auto v = (*d2)->Get("default-k");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "d");
  EXPECT_EQ((*x)->Get("default-k").status().code(), StatusCode::kNotFound);
}

TEST(OpenMetadataStoreTest, BadUrisAreInvalidArgument) {
  for (const std::string uri :
       {"", "embedded", "redis://127.0.0.1:6379", "http://", "http://127.0.0.1",
        "http://127.0.0.1:", "http://:80", "http://127.0.0.1:abc", "http://127.0.0.1:0",
        "http://127.0.0.1:70000", "http://127.0.0.1:80x", "etcd://127.0.0.1:-1",
        "etcd://user@host:2379"}) {
    auto store = OpenMetadataStore(uri);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << "'" << uri << "'";
  }
  MetadataOptions no_ttl;
  no_ttl.ttl = milliseconds(0);
  EXPECT_EQ(OpenMetadataStore("http://127.0.0.1:1", no_ttl).status().code(),
            StatusCode::kInvalidArgument);
}

// An address nothing listens on: refused at once.
TEST(OpenMetadataStoreTest, UnreachableServerIsUnavailableNamingTheAddress) {
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  MetadataOptions options;
  options.timeout = milliseconds(500);
  for (const std::string scheme : {"http://", "etcd://"}) {
    const auto start = Clock::now();
    auto store = OpenMetadataStore(scheme + "127.0.0.1:" + std::to_string(port), options);
    EXPECT_LT(Clock::now() - start, milliseconds(2000));
    EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
    EXPECT_NE(store.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << store.status().message();
  }
}

// A socket that accepts connections (the kernel completes them) but never answers.
TEST(OpenMetadataStoreTest, SilentServerTimesOut) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  const int port = ntohs(addr.sin_port);
  MetadataOptions options;
  options.timeout = milliseconds(300);
  for (const std::string scheme : {"http://", "etcd://"}) {
    const auto start = Clock::now();
    auto store = OpenMetadataStore(scheme + "127.0.0.1:" + std::to_string(port), options);
    const auto took = Clock::now() - start;
    EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
    EXPECT_GE(took, milliseconds(250));
    EXPECT_LT(took, milliseconds(2000));
  }
  close(fd);
}

TEST(MetadataBase64Test, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(internal::Base64Encode(plain), encoded);
    auto decoded = internal::Base64Decode(encoded);
    ASSERT_TRUE(decoded.ok()) << encoded;
    EXPECT_EQ(*decoded, plain);
  }
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  auto round = internal::Base64Decode(internal::Base64Encode(all_bytes));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(*round, all_bytes);
  for (const char* bad : {"Zg=", "Zm9v!A==", "Z===", "=Zm9"}) {
    EXPECT_EQ(internal::Base64Decode(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// The HTTP server's protocol, spoken directly.
class MetadataHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = MetadataHttpServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // POSTs raw text; returns {status, body}.
  std::pair<int, nlohmann::json> Post(const char* path, const std::string& body) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(std::chrono::seconds(2));
    auto res = client.Post(path, body, "application/json");
    if (!res) return {-1, nullptr};
    return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
  }
  std::pair<int, nlohmann::json> Post(const char* path, const nlohmann::json& body) {
    return Post(path, body.dump());
  }

  std::unique_ptr<MetadataHttpServer> server_;
};

namespace proto = internal::http_protocol;

TEST_F(MetadataHttpServerTest, MalformedRequestsAre400WithAReason) {
  EXPECT_EQ(Post(proto::kPut, std::string("{not json")).first, 400);
  EXPECT_EQ(Post(proto::kPut, std::string("[1]")).first, 400);
  EXPECT_EQ(Post(proto::kLeaseGrant, nlohmann::json{{"ttl_ms", -5}}).first, 400);
  EXPECT_EQ(Post(proto::kLeaseGrant, nlohmann::json{{"ttl_ms", "5"}}).first, 400);
  auto [status, body] = Post(proto::kGet, nlohmann::json{{"key", "not base64!"}});
  EXPECT_EQ(status, 400);
  ASSERT_TRUE(body.is_object());
  EXPECT_TRUE(body.contains("error"));
}

TEST_F(MetadataHttpServerTest, PutNeedsALiveLease) {
  auto [status, body] =
      Post(proto::kPut, nlohmann::json{{"key", "YQ=="}, {"value", "Yg=="}, {"lease", 12345}});
  EXPECT_EQ(status, 404);
}

TEST_F(MetadataHttpServerTest, KeysGoWhenTheLeaseIsNotRenewed) {
  auto [gs, grant] = Post(proto::kLeaseGrant, nlohmann::json{{"ttl_ms", 300}});
  ASSERT_EQ(gs, 200);
  const int64_t lease = grant["lease"].get<int64_t>();
  ASSERT_EQ(
      Post(proto::kPut, nlohmann::json{{"key", "YQ=="}, {"value", "Yg=="}, {"lease", lease}}).first,
      200);
  // Renewed once half way: still there after the first TTL has passed.
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_EQ(Post(proto::kLeaseKeepAlive, nlohmann::json{{"lease", lease}}).first, 200);
  std::this_thread::sleep_for(milliseconds(200));
  auto [s1, got] = Post(proto::kGet, nlohmann::json{{"key", "YQ=="}});
  ASSERT_EQ(s1, 200);
  EXPECT_EQ(got["value"], "Yg==");
  // Not renewed again: gone, and the lease with it.
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_EQ(Post(proto::kGet, nlohmann::json{{"key", "YQ=="}}).first, 404);
  EXPECT_EQ(Post(proto::kLeaseKeepAlive, nlohmann::json{{"lease", lease}}).first, 404);
}

TEST_F(MetadataHttpServerTest, PortInUseIsAnError) {
  auto second = MetadataHttpServer::Start("127.0.0.1", server_->port());
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(MetadataHttpServer::Start("127.0.0.1", 70000).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::transfer
