// The transfer benchmark behind `tandem transfer-bench` (apps/tandem only registers its flags):
// throughput and latency of the transfer engine (and of plain memcpy,
// the physical limit on one host), in the spirit of Mooncake's transfer_engine_bench.
//
//   tandem transfer-bench --protocol tcp --block-size 1MiB --batch-size 32 --duration 5 --json
//
// Without --segment the initiator measures loopback by itself: it serves the metadata over HTTP
// on 127.0.0.1, starts a target process (itself, `--mode target`), waits for it to publish its
// segment, runs, and stops it. With --segment it uses a target started elsewhere against the
// same --metadata. Results: GB/s (1e9 bytes per second) and p50/p99 batch latency in µs.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace tandem::bench {

struct TransferBenchOptions {
  std::string mode = "initiator";         // initiator | target
  std::string protocol = "tcp";           // shm | tcp | ucx | memcpy
  std::string operation = "write";        // read | write
  std::string block_size = "64KiB";       // bytes per request
  int batch_size = 32;                    // requests per batch
  int threads = 1;                        // initiator threads, one batch in flight each
  double duration_s = 5.0;                // measured seconds (after a short warm-up)
  std::string metadata;                   // embedded:/http:///etcd:// URI; empty: own HTTP server
  std::string segment;                    // target segment name; empty: start a loopback target
  std::string buffer_size;                // segment bytes; empty: threads x batch x block (capped)
  std::string listen_host = "127.0.0.1";  // target's data listener
  double lifetime_s = 0;                  // target: exit after this long (0: until SIGINT/SIGTERM)
  bool json = false;                      // one JSON object on stdout
};

// Runs the initiator or the target of `options`; the process exit code (results on stdout,
// errors on stderr). The loopback target is this binary started as
// `transfer-bench --mode target`, so the caller must be the `tandem` binary.
int RunTransferBench(const TransferBenchOptions& options);

// "4096", "4KiB"/"4K" (1024), "1MiB"/"1M", "1GiB"/"1G", "4KB"/"1MB"/"1GB" (1000). In (0, 1 GiB].
StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace tandem::bench
