#include "transfer/transfer_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/subprocess.h"

namespace tandem::transfer::testing {

void FillRandom(void* dst, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* p = static_cast<uint8_t*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

std::shared_ptr<MetadataStore> FreshEmbeddedStore() {
  static std::atomic<int> counter{0};
  auto store = OpenMetadataStore("embedded:transfer-test-" + std::to_string(::getpid()) + "-" +
                                 std::to_string(counter.fetch_add(1)));
  if (!store.ok()) {
    ADD_FAILURE() << store.status().ToString();
    return nullptr;
  }
  return *store;
}

std::unique_ptr<TransferEngine> MakeEngine(const std::string& name,
                                           std::shared_ptr<MetadataStore> metadata,
                                           std::vector<Protocol> protocols) {
  TransferEngineOptions o;
  o.local_name = name;
  o.metadata = std::move(metadata);
  o.protocols = std::move(protocols);
  auto engine = TransferEngine::Create(o);
  if (!engine.ok()) {
    ADD_FAILURE() << "creating engine " << name << ": " << engine.status().ToString();
    return nullptr;
  }
  return std::move(*engine);
}

namespace {

// Inodes of TCP sockets (v4 and v6) with local or remote port `port`.
std::set<std::string> SocketInodesWithPort(int port) {
  std::set<std::string> inodes;
  for (const char* path : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      ls >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
      auto port_of = [](const std::string& addr) {
        const size_t colon = addr.rfind(':');
        return colon == std::string::npos ? -1 : std::stoi(addr.substr(colon + 1), nullptr, 16);
      };
      if (port_of(local) == port || port_of(remote) == port) inodes.insert(inode);
    }
  }
  return inodes;
}

}  // namespace

int CountFds(int ignore_port) {
  const std::set<std::string> ignored =
      ignore_port > 0 ? SocketInodesWithPort(ignore_port) : std::set<std::string>();
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  const int own = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    char link[256];
    const ssize_t len = ::readlinkat(own, e->d_name, link, sizeof(link) - 1);
    if (len > 0) {
      link[len] = '\0';
      const std::string target(link);
      if (target.rfind("socket:[", 0) == 0 &&
          ignored.count(target.substr(8, target.size() - 9)) != 0) {
        continue;
      }
    }
    ++n;
  }
  ::closedir(dir);
  return n;
}

int CountMapsLines() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

int CountSegmentMappings() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("memfd:tandem:") != std::string::npos ? 1 : 0;
  return n;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto limit = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= limit) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::unique_ptr<PeerProcess> PeerProcess::Start(const std::string& metadata_uri,
                                                const std::string& name, const std::string& segment,
                                                uint64_t size) {
  SpawnOptions o;
  o.argv = {TANDEM_TRANSFER_TEST_PEER, metadata_uri, name, segment, std::to_string(size)};
  o.pipe_stdin = true;
  o.pipe_stdout = true;
  auto child = Spawn(o);
  if (!child.ok()) {
    ADD_FAILURE() << child.status().ToString();
    return nullptr;
  }
  auto peer = std::unique_ptr<PeerProcess>(new PeerProcess());
  peer->pid_ = child->pid;
  peer->stdin_fd_ = child->stdin_fd;
  // Wait (bounded) for "READY\n".
  const std::string got =
      ReadLine(child->stdout_fd, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  ::close(child->stdout_fd);
  if (got.rfind("READY", 0) != 0) {
    ADD_FAILURE() << "peer did not become ready; said: '" << got << "'";
    return nullptr;  // the destructor kills it
  }
  return peer;
}

void PeerProcess::Signal(int sig) {
  if (pid_ <= 0 || reaped_) return;
  ::kill(pid_, sig);
  if (sig == SIGKILL) {
    ::waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
}

PeerProcess::~PeerProcess() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  Signal(SIGKILL);
}

}  // namespace tandem::transfer::testing
