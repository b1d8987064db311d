// `tandem worker`: one engine instance of a disaggregated cluster (role prefill, decode or
// mixed) serving the control protocol of src/cluster/protocol.h and publishing itself in the
// metadata service. `tandem serve` starts these as child processes; on several hosts they are
// started by hand (or an orchestrator) with --metadata etcd://... .
// SIGTERM/SIGINT: unpublish, finish what is in flight (up to --drain-timeout-s), exit 0.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "worker_flags.h"

namespace tandem::app {

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

}  // namespace tandem::app
