// Test support: a throwaway single-member etcd on loopback. Start() picks free client and peer
// ports, uses a fresh temporary data directory and waits until etcd answers /health; the
// destructor stops the process and removes the directory.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace tandem::transfer::testing {

class EtcdProcess {
 public:
  // The binary is $TANDEM_ETCD_BIN, else /usr/bin/etcd. FailedPrecondition if it is missing
  // (scripts/setup.sh installs Debian's etcd-server); Unavailable if etcd does not become
  // healthy within `start_timeout_ms`.
  static StatusOr<std::unique_ptr<EtcdProcess>> Start(int start_timeout_ms = 15000);
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  int client_port() const { return client_port_; }
  // "etcd://127.0.0.1:<client port>"
  std::string uri() const;

 private:
  EtcdProcess() = default;
  // The last lines of etcd's log, for failure messages.
  std::string LogTail() const;

  pid_t pid_ = -1;
  int client_port_ = 0;
  std::string dir_;  // temporary; holds the data dir and etcd.log; removed by the destructor
};

// A loopback TCP port that was free a moment ago (bound to port 0, then closed).
int FreeLoopbackPort();

}  // namespace tandem::transfer::testing
