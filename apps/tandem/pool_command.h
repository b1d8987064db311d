// The KV pool's standalone processes (store/pool.h), for clusters of several hosts:
//   `tandem pool-master`  the master, its state journaled in the metadata service (etcd), so
//                         that a restarted master, or a standby started beside it, takes over
//                         with every object it knew; while another master is published, it
//                         waits (a standby) and takes over when that one's lease lapses;
//   `tandem store`        a storage node: contributes DRAM to the pool without an engine.
// Both run until SIGTERM/SIGINT.
//   `tandem pool-bench`   measures fetches from the pool (GB/s, p50/p99 per batch): puts
//                         objects (they land on other nodes' segments: this client mounts
//                         none), then reads them back in batches with GetPrefix for a while.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tandem::app {

struct PoolMasterFlags {
  std::string metadata;  // http://... or etcd://...
  std::string host = "127.0.0.1";
  int port = 0;
  std::string journal = "on";
  int hot_gets = 8;  // gets before a hot object gets one more replica (0: never)
  int max_replicas = 2;
  std::string cluster_token_file;
};
CLI::App* AddPoolMasterCommand(CLI::App& app, PoolMasterFlags& flags);
int RunPoolMaster(const PoolMasterFlags& flags);

struct StoreFlags {
  std::string metadata;
  std::string name;  // default: store-<pid>
  std::string host = "127.0.0.1";
  int dram_mb = 1024;
  std::string transfer_protocols = "shm,tcp";
  std::string cluster_token_file;
};
CLI::App* AddStoreCommand(CLI::App& app, StoreFlags& flags);
int RunStore(const StoreFlags& flags);

struct PoolBenchFlags {
  std::string metadata;
  std::string host = "127.0.0.1";
  std::string transfer_protocols = "shm,tcp";
  uint64_t block_bytes = 368640;  // one SmolLM2-135M KV block of 16 tokens (f16)
  int batch = 32;                 // objects per GetPrefix
  int objects = 256;              // distinct objects stored and cycled through
  double duration_s = 3;
  bool json = false;
  std::string cluster_token_file;
};
CLI::App* AddPoolBenchCommand(CLI::App& app, PoolBenchFlags& flags);
int RunPoolBench(const PoolBenchFlags& flags);

}  // namespace tandem::app
