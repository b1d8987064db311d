#include "worker_flags.h"

#include <sstream>

#include "transfer/transfer_engine.h"

namespace tandem::app {

StatusOr<std::vector<std::string>> ParseProtocolList(const std::string& text) {
  std::stringstream in(text);
  std::string item;
  std::vector<std::string> names;
  while (std::getline(in, item, ',')) {
    if (!transfer::ParseProtocol(item).ok()) {
      return InvalidArgument("unknown transfer protocol '" + item + "' (shm, tcp, ucx)");
    }
    names.push_back(item);
  }
  if (names.empty()) return InvalidArgument("no transfer protocol given");
  return names;
}

void AddWorkerFlags(CLI::App* cmd, WorkerFlags& f) {
  cmd->add_option("--role", f.role, "prefill, decode or mixed")
      ->check(CLI::IsMember({"prefill", "decode", "mixed"}))
      ->capture_default_str();
  cmd->add_option("--name", f.name, "Unique name in the cluster (default: <role>-<pid>)");
  AddClusterTokenFlag(cmd, f.cluster_token_file);
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
      ->required();
  AddModelFlag(cmd, f.model);
  cmd->add_option("--host", f.host, "Address of the control endpoint and KV listener")
      ->capture_default_str();
  cmd->add_option("--port", f.port, "Control port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--threads", f.threads, "Engine threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--max-threads", f.max_threads,
                  "Engine threads the worker may be resized to at runtime (POST /v1/threads, "
                  "elastic pools); they are started and park until used (0: --threads)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity in tokens")
      ->check(CLI::Range(16, 1 << 26))
      ->capture_default_str();
  AddSchedulerFlags(cmd, f.knobs);
  AddTransferFlags(cmd, f.knobs);
}

std::vector<std::string> WorkerArgv(const WorkerFlags& f) {
  std::vector<std::string> argv;
  auto add = [&argv](const char* flag, std::string value) {
    argv.push_back(flag);
    argv.push_back(std::move(value));
  };
  add("--role", f.role);
  add("--metadata", f.metadata);
  add("--host", f.host);
  add("--port", std::to_string(f.port));
  add("--threads", std::to_string(f.threads));
  add("--max-threads", std::to_string(f.max_threads));
  add("--kv-cache-tokens", std::to_string(f.kv_cache_tokens));
  if (!f.name.empty()) add("--name", f.name);
  if (!f.model.empty()) add("--model", f.model);
  const std::vector<std::string> knobs = WorkerKnobArgs(f.knobs);
  argv.insert(argv.end(), knobs.begin(), knobs.end());
  return argv;
}

}  // namespace tandem::app
