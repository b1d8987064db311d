// `tandem worker`: one engine instance of a disaggregated cluster (role prefill, decode or
// mixed) serving the control protocol of src/cluster/protocol.h and publishing itself in the
// metadata service. `tandem serve` starts these as child processes; on several hosts they are
// started by hand (or an orchestrator) with --metadata etcd://... .
// SIGTERM/SIGINT: unpublish, finish what is in flight (up to --drain-timeout-s), exit 0.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace tandem::app {

struct WorkerFlags {
  std::string role = "mixed";
  std::string name;                // default: "<role>-<pid>"
  std::string metadata;            // required: http://host:port or etcd://host:port
  std::string model;               // default: the bundled model
  std::string host = "127.0.0.1";  // control endpoint and transfer listener
  int port = 0;                    // 0: any free port
  int threads = 1;
  int kv_cache_tokens = 16384;
  int block_tokens = 16;
  int max_num_seqs = 32;
  int max_batch_tokens = 256;
  int max_waiting = 256;
  std::string protocols = "shm,tcp";  // transfer protocols in order of preference
  double drain_timeout_s = 30;
  double kv_transfer_timeout_s = 10;  // a KV push batch not landed by then fails
  std::string cost_profile = "auto";  // cluster/calibration.h LoadOrCalibrate
};

// `tandem profile`: measures the cost model of an engine configuration (what a worker would
// publish) and writes it to a file, or prints it.
struct ProfileFlags {
  std::string model;
  int threads = 1;
  int block_tokens = 16;
  int max_batch_tokens = 256;
  int kv_cache_tokens = 16384;
  std::string out;  // empty: the default profile path a worker with these settings loads
};
CLI::App* AddProfileCommand(CLI::App& app, ProfileFlags& flags);
int RunProfile(const ProfileFlags& flags);

CLI::App* AddWorkerCommand(CLI::App& app, WorkerFlags& flags);
int RunWorker(const WorkerFlags& flags);

// Parses "shm,tcp" into transfer protocol names (shared with serve); InvalidArgument naming an
// unknown one.
StatusOr<std::vector<std::string>> ParseProtocolList(const std::string& text);

}  // namespace tandem::app
