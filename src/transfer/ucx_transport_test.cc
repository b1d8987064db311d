// The UCX transport on UCX's own TCP and shared-memory transports (never InfiniBand): data
// moves both ways, every request is reported exactly once, bad input is refused, deadlines hold,
// and a dead peer fails requests instead of hanging them.
#include "transfer/ucx_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"

namespace tandem::transfer {
namespace {

using namespace std::chrono_literals;

constexpr const char* kChildEnv = "TANDEM_UCX_TEST_CHILD";

// Collects completion reports; counts how often each request was reported.
class Completions {
 public:
  explicit Completions(size_t n) : calls_(n, 0), statuses_(n) {}
  CompletionCallback For(size_t i) {
    return [this, i](Status st) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[i];
      statuses_[i] = std::move(st);
      ++total_;
      cv_.notify_all();
    };
  }
  // True once every request was reported at least once, waiting at most `timeout`.
  bool WaitAll(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return total_ >= calls_.size(); });
  }
  int calls(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[i];
  }
  Status status(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_[i];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> calls_;
  std::vector<Status> statuses_;
  size_t total_ = 0;
};

std::unique_ptr<Transport> Make(const std::string& name, const std::string& tls) {
  UcxTransportOptions o;
  o.tls = tls;
  auto t = MakeUcxTransport(nullptr, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

SegmentDescriptor Publish(Transport& t, const std::string& name, void* base, uint64_t size) {
  LocalRegion region;
  region.segment_name = name;
  region.base = base;
  region.size = size;
  SegmentDescriptor desc;
  desc.name = name;
  desc.size = size;
  Status st = t.OnRegister(region, &desc);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return desc;
}

class UcxTransportTest : public ::testing::TestWithParam<const char*> {};

// Writes a pattern in many concurrent requests, reads it back, and checks both copies.
TEST_P(UcxTransportTest, WriteThenReadMovesTheBytes) {
  auto target = Make("target", GetParam());
  auto initiator = Make("initiator", GetParam());
  ASSERT_NE(target, nullptr);
  ASSERT_NE(initiator, nullptr);
  constexpr size_t kBlock = 64 << 10, kBlocks = 48, kSize = kBlock * kBlocks;
  std::vector<unsigned char> remote(kSize, 0), src(kSize), back(kSize, 0);
  for (size_t i = 0; i < kSize; ++i) src[i] = static_cast<unsigned char>((i * 131 + 7) % 251);
  const SegmentDescriptor desc = Publish(*target, "t/kv", remote.data(), kSize);
  ASSERT_TRUE(initiator->CanReach(desc));
  LocalRegion local{"", src.data(), kSize, -1};
  ASSERT_TRUE(initiator->OnRegister(local, nullptr).ok());  // local memory: mapped, unpublished
  auto seg = initiator->Open(desc);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();

  Completions writes(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    TransferRequest r{OpCode::kWrite, src.data() + i * kBlock, {}, i * kBlock, kBlock};
    initiator->Submit(**seg, r, Clock::now() + 10s, writes.For(i));
  }
  ASSERT_TRUE(writes.WaitAll(15s));
  for (size_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(writes.status(i).ok()) << writes.status(i).ToString();
  }
  EXPECT_EQ(std::memcmp(remote.data(), src.data(), kSize), 0);

  Completions reads(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    TransferRequest r{OpCode::kRead, back.data() + i * kBlock, {}, i * kBlock, kBlock};
    initiator->Submit(**seg, r, Clock::now() + 10s, reads.For(i));
  }
  ASSERT_TRUE(reads.WaitAll(15s));
  for (size_t i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(reads.status(i).ok()) << reads.status(i).ToString();
  }
  EXPECT_EQ(std::memcmp(back.data(), src.data(), kSize), 0);

  std::this_thread::sleep_for(50ms);  // a second report would arrive by now
  for (size_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(writes.calls(i), 1);
    EXPECT_EQ(reads.calls(i), 1);
  }
  seg->reset();
  initiator->OnUnregister(local);
  target->OnUnregister(LocalRegion{"t/kv", remote.data(), kSize, -1});
}

// UCX_TLS spellings: its TCP transport, and its shared-memory ones (with loopback "self").
INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest, ::testing::Values("tcp", "posix,sysv,cma,self"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Tcp" : "SharedMemory");
                         });

TEST(UcxTransport, RefusesBadInputWithoutCrashing) {
  auto t = Make("t", "tcp");
  ASSERT_NE(t, nullptr);
  SegmentDescriptor bad;
  bad.name = "x";
  bad.size = 4096;
  EXPECT_FALSE(t->CanReach(bad));  // no ucx address
  for (const char* addr : {"ucx1:", "tcp:abcd", "ucx1:zz:10:ab", "ucx1:ab:10", "ucx1:abc:10:ab",
                           "ucx1:ab:123456789abcdef01:ab"}) {
    bad.ucx_address = addr;
    EXPECT_FALSE(t->CanReach(bad)) << addr;
    EXPECT_FALSE(t->Open(bad).ok()) << addr;
  }
  LocalRegion empty;
  SegmentDescriptor desc;
  EXPECT_EQ(t->OnRegister(empty, &desc).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(MakeUcxTransport(nullptr, UcxTransportOptions{"tcp", -1, 1000}).ok());
  EXPECT_FALSE(MakeUcxTransport(nullptr, UcxTransportOptions{"no-such-transport", 50, 1000}).ok());
}

TEST(UcxTransport, OutOfRangeAndLateRequestsAreReportedOnce) {
  auto target = Make("target", "tcp");
  auto initiator = Make("initiator", "tcp");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(initiator, nullptr);
  std::vector<char> remote(8192), local(8192);
  const SegmentDescriptor desc = Publish(*target, "t/kv", remote.data(), remote.size());
  auto seg = initiator->Open(desc);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  Completions c(3);
  initiator->Submit(**seg, {OpCode::kWrite, local.data(), {}, 4096, 8192}, Clock::now() + 5s,
                    c.For(0));
  initiator->Submit(**seg, {OpCode::kRead, local.data(), {}, 0, 0}, Clock::now() + 5s, c.For(1));
  initiator->Submit(**seg, {OpCode::kWrite, local.data(), {}, 0, 4096}, Clock::now() - 1ms,
                    c.For(2));
  ASSERT_TRUE(c.WaitAll(5s));
  EXPECT_EQ(c.status(0).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(c.status(1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(c.status(2).code(), StatusCode::kDeadlineExceeded);
  std::this_thread::sleep_for(50ms);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(c.calls(i), 1);
}

// Requests queued when the transport goes away are reported (cancelled), not lost.
TEST(UcxTransport, DestructionReportsEverything) {
  auto target = Make("target", "tcp");
  auto initiator = Make("initiator", "tcp");
  ASSERT_NE(target, nullptr);
  ASSERT_NE(initiator, nullptr);
  std::vector<char> remote(1 << 20), local(1 << 20);
  const SegmentDescriptor desc = Publish(*target, "t/kv", remote.data(), remote.size());
  auto seg = initiator->Open(desc);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  constexpr size_t kN = 64;
  Completions c(kN);
  for (size_t i = 0; i < kN; ++i) {
    initiator->Submit(**seg, {OpCode::kWrite, local.data(), {}, 0, local.size()}, Clock::now() + 5s,
                      c.For(i));
  }
  initiator.reset();
  ASSERT_TRUE(c.WaitAll(5s));
  std::this_thread::sleep_for(50ms);
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(c.calls(i), 1);
  seg->reset();  // the segment outlives its transport: harmless
}

// A peer process that publishes 1 MiB over UCX's TCP transport, prints its descriptor's ucx
// address on stdout and waits to be killed (at most 60 s).
void RunChild() {
  UcxTransportOptions o;
  o.tls = "tcp";
  auto t = MakeUcxTransport(nullptr, o);
  if (!t.ok()) {
    std::fprintf(stderr, "child: %s\n", t.status().ToString().c_str());
    _exit(3);
  }
  static std::vector<char> memory(1 << 20);
  SegmentDescriptor desc = Publish(**t, "child/kv", memory.data(), memory.size());
  std::printf("%s\n", desc.ucx_address.c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);
  _exit(0);
}

// Runs the peer before main() when this binary is started as one (see PeerDeathFailsRequests).
const bool kIsChild = [] {
  if (std::getenv(kChildEnv) != nullptr) RunChild();
  return false;
}();

// Starts this binary as a peer (RunChild); its ucx address, or "" after 20 s without one.
std::string StartChild(pid_t* pid) {
  SpawnOptions o;
  o.argv = {"/proc/self/exe"};
  o.env = {{kChildEnv, "1"}};
  o.pipe_stdout = true;
  auto child = Spawn(o);
  if (!child.ok()) return "";
  *pid = child->pid;
  const std::string line = ReadLine(child->stdout_fd, Clock::now() + 20s);
  close(child->stdout_fd);
  return line;
}

void StopChild(pid_t pid) {
  kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
}

// A peer that stops answering: the late request ends with DeadlineExceeded by its deadline (plus
// the engine's reaping slack), and once the peer is back a new request gets a fresh endpoint.
TEST(UcxTransport, StalledPeerHitsTheDeadlineThenRecovers) {
  pid_t pid = -1;
  const std::string address = StartChild(&pid);
  ASSERT_FALSE(address.empty()) << "child printed no address";
  auto initiator = Make("initiator", "tcp");
  ASSERT_NE(initiator, nullptr);
  SegmentDescriptor desc;
  desc.name = "child/kv";
  desc.size = 1 << 20;
  desc.ucx_address = address;
  auto seg = initiator->Open(desc);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  std::vector<char> local(1 << 20, 'y');
  // kill() only queues the stop: the child's threads halt when each is next scheduled, and on a
  // busy machine its progress thread could still serve the write below. Wait until the whole
  // child has stopped.
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(wstatus)) << "child did not stop: status " << wstatus;
  {
    Completions c(1);
    const auto start = Clock::now();
    initiator->Submit(**seg, {OpCode::kWrite, local.data(), {}, 0, local.size()}, start + 300ms,
                      c.For(0));
    ASSERT_TRUE(c.WaitAll(3s)) << "a request to a stalled peer hung";
    EXPECT_EQ(c.status(0).code(), StatusCode::kDeadlineExceeded) << c.status(0).ToString();
    EXPECT_LT(Clock::now() - start, 300ms + kReapSlack);
  }
  kill(pid, SIGCONT);
  {
    Completions c(1);
    initiator->Submit(**seg, {OpCode::kRead, local.data(), {}, 0, local.size()}, Clock::now() + 10s,
                      c.For(0));
    ASSERT_TRUE(c.WaitAll(12s));
    EXPECT_TRUE(c.status(0).ok()) << c.status(0).ToString();
  }
  StopChild(pid);
}

TEST(UcxTransport, PeerDeathFailsRequests) {
  pid_t pid = -1;
  const std::string line = StartChild(&pid);
  ASSERT_FALSE(line.empty()) << "child printed no address";

  auto initiator = Make("initiator", "tcp");
  ASSERT_NE(initiator, nullptr);
  SegmentDescriptor desc;
  desc.name = "child/kv";
  desc.size = 1 << 20;
  desc.ucx_address = line;
  auto seg = initiator->Open(desc);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  std::vector<char> local(1 << 20, 'x');
  {
    Completions c(1);
    initiator->Submit(**seg, {OpCode::kWrite, local.data(), {}, 0, local.size()},
                      Clock::now() + 10s, c.For(0));
    ASSERT_TRUE(c.WaitAll(12s));
    EXPECT_TRUE(c.status(0).ok()) << c.status(0).ToString();
  }
  StopChild(pid);

  // Every request after the death fails, each within its deadline; soon with Unavailable.
  bool saw_unavailable = false;
  for (int attempt = 0; attempt < 20 && !saw_unavailable; ++attempt) {
    Completions c(1);
    const auto start = Clock::now();
    initiator->Submit(**seg, {OpCode::kRead, local.data(), {}, 0, local.size()}, start + 2s,
                      c.For(0));
    ASSERT_TRUE(c.WaitAll(4s)) << "a request to a dead peer hung";
    EXPECT_FALSE(c.status(0).ok());
    saw_unavailable = c.status(0).code() == StatusCode::kUnavailable;
  }
  EXPECT_TRUE(saw_unavailable);
}

}  // namespace
}  // namespace tandem::transfer
