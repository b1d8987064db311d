#include "transfer/etcd_test_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/subprocess.h"

namespace tandem::transfer::testing {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(int start_timeout_ms) {
  const char* env_bin = std::getenv("TANDEM_ETCD_BIN");
  const std::string bin = env_bin != nullptr && *env_bin != '\0' ? env_bin : "/usr/bin/etcd";
  if (access(bin.c_str(), X_OK) != 0) {
    return FailedPrecondition("etcd binary " + bin +
                              " not found: scripts/setup.sh installs it (Debian package "
                              "etcd-server)");
  }
  std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
  std::string templ = (std::filesystem::temp_directory_path() / "tandem-etcd-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) return Internal("mkdtemp failed for " + templ);
  etcd->dir_ = templ;
  etcd->client_port_ = FreeLoopbackPort();
  const int peer_port = FreeLoopbackPort();
  if (etcd->client_port_ <= 0 || peer_port <= 0 || peer_port == etcd->client_port_) {
    return Internal("could not find two free loopback ports");
  }
  const std::string client = "http://127.0.0.1:" + std::to_string(etcd->client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
  // A short heartbeat and election timeout lower etcd's minimum lease TTL to 1 s
  // (minimum TTL = 1.5 x election timeout, rounded up to whole seconds).
  std::vector<std::string> args = {bin,
                                   "--name",
                                   "default",
                                   "--data-dir",
                                   etcd->dir_ + "/data",
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--listen-peer-urls",
                                   peer,
                                   "--initial-advertise-peer-urls",
                                   peer,
                                   "--initial-cluster",
                                   "default=" + peer,
                                   "--heartbeat-interval",
                                   "50",
                                   "--election-timeout",
                                   "500",
                                   "--log-level",
                                   "warn"};
  SpawnOptions o;
  o.argv = args;
  o.output_file = etcd->dir_ + "/etcd.log";
  TANDEM_ASSIGN_OR_RETURN(Subprocess child, Spawn(o));
  const pid_t pid = child.pid;
  etcd->pid_ = pid;

  const auto deadline = Clock::now() + std::chrono::milliseconds(start_timeout_ms);
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      etcd->pid_ = -1;
      return Unavailable("etcd exited during start-up; log:\n" + etcd->LogTail());
    }
    httplib::Client probe("127.0.0.1", etcd->client_port_);
    probe.set_connection_timeout(std::chrono::milliseconds(200));
    probe.set_read_timeout(std::chrono::milliseconds(500));
    if (auto res = probe.Get("/health");
        res && res->status == 200 && res->body.find("true") != std::string::npos) {
      return etcd;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Unavailable("etcd did not become healthy within " + std::to_string(start_timeout_ms) +
                     " ms; log:\n" + etcd->LogTail());
}

EtcdProcess::~EtcdProcess() {
  if (pid_ > 0) {
    StopProcess(pid_, SIGTERM, std::chrono::seconds(5));
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string EtcdProcess::uri() const { return "etcd://127.0.0.1:" + std::to_string(client_port_); }

std::string EtcdProcess::LogTail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

}  // namespace tandem::transfer::testing
