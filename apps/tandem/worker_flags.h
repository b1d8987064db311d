// The flags of `tandem worker`, and the command line that gives them back: `tandem serve`
// starts its workers with WorkerArgv, so each knob is spelled only where it is registered.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "flags.h"

namespace tandem::app {

struct WorkerFlags {
  std::string role = "mixed";
  std::string name;                // default: "<role>-<pid>"
  std::string metadata;            // required: http://host:port or etcd://host:port
  std::string model;               // default: the bundled model
  std::string host = "127.0.0.1";  // control endpoint and transfer listener
  int port = 0;                    // 0: any free port
  int threads = 1;
  int max_threads = 0;  // what POST /v1/threads may resize it to (0: --threads)
  int kv_cache_tokens = 16384;
  std::string cluster_token_file;  // empty: $TANDEM_CLUSTER_TOKEN, else none
  WorkerKnobs knobs;               // what `tandem serve` passes on unchanged

  bool operator==(const WorkerFlags&) const = default;
};

// Registers the flags of `tandem worker` on cmd; `flags` must outlive parsing.
void AddWorkerFlags(CLI::App* cmd, WorkerFlags& flags);
// The arguments after `tandem [--log-level L] worker` that parse (AddWorkerFlags) into a struct
// equal to `flags`.
std::vector<std::string> WorkerArgv(const WorkerFlags& flags);

// Parses "shm,tcp" into transfer protocol names (shared with serve); InvalidArgument naming an
// unknown one.
StatusOr<std::vector<std::string>> ParseProtocolList(const std::string& text);

}  // namespace tandem::app
