// A process owning one segment, for the transfer engine's failure tests (kill -9, SIGSTOP).
//
//   transfer_test_peer <metadata uri> <engine name> <segment name> <segment bytes>
//
// Publishes the segment (AllocateSegment), prints "READY\n" on stdout, then waits until its
// stdin closes (the test ended or died) or 120 s passed, and exits.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "transfer/transfer_engine.h"

using namespace tandem::transfer;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <metadata uri> <engine name> <segment> <bytes>\n", argv[0]);
    return 2;
  }
  auto store = OpenMetadataStore(argv[1]);
  if (!store.ok()) {
    std::fprintf(stderr, "metadata: %s\n", store.status().ToString().c_str());
    return 1;
  }
  TransferEngineOptions o;
  o.local_name = argv[2];
  o.metadata = *store;
  auto engine = TransferEngine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const uint64_t size = std::stoull(argv[4]);
  auto seg = (*engine)->AllocateSegment(argv[3], size);
  if (!seg.ok()) {
    std::fprintf(stderr, "segment: %s\n", seg.status().ToString().c_str());
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < limit) {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      char c;
      if (::read(0, &c, 1) <= 0) break;  // stdin closed
    }
  }
  return 0;
}
