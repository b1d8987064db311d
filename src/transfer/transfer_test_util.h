// Helpers shared by the transfer engine tests: random data, resource counting (/proc/self/fd,
// /proc/self/maps), bounded waiting, and a peer process (transfer_test_peer) to kill or stop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace tandem::transfer::testing {

// Deterministic pseudo-random bytes.
void FillRandom(void* dst, size_t n, uint64_t seed);

// A fresh "embedded:<unique>" store, so that tests do not see each other's segments.
std::shared_ptr<MetadataStore> FreshEmbeddedStore();

// An engine on loopback with the given protocols; fails the test (ADD_FAILURE) and returns
// nullptr on error.
std::unique_ptr<TransferEngine> MakeEngine(const std::string& name,
                                           std::shared_ptr<MetadataStore> metadata,
                                           std::vector<Protocol> protocols = {Protocol::kShm,
                                                                              Protocol::kTcp});

// Open file descriptors of this process, not counting sockets with local or remote port
// `ignore_port` (e.g. the metadata HTTP server, whose connections come and go on their own).
int CountFds(int ignore_port = -1);
// Lines of /proc/self/maps; and those naming a tandem memfd (segment mappings).
int CountMapsLines();
int CountSegmentMappings();

// Polls pred every 5 ms until it holds or `timeout` passed; returns its last value.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

// transfer_test_peer running as a child process: an engine on `metadata_uri` owning a segment
// `segment` of `size` bytes. Killed (SIGKILL) and reaped on destruction.
class PeerProcess {
 public:
  static std::unique_ptr<PeerProcess> Start(const std::string& metadata_uri,
                                            const std::string& name, const std::string& segment,
                                            uint64_t size);
  ~PeerProcess();
  pid_t pid() const { return pid_; }
  // Sends sig; for SIGKILL also reaps the child.
  void Signal(int sig);

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;  // the child exits when this closes
  bool reaped_ = false;
};

}  // namespace tandem::transfer::testing
