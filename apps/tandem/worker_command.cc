#include "worker_command.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <sstream>
#include <thread>

#include "cluster/calibration.h"
#include "cluster/worker.h"
#include "engine/engine.h"
#include "common/logging.h"
#include "generate_command.h"

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

CLI::App* AddWorkerCommand(CLI::App& app, WorkerFlags& f) {
  CLI::App* cmd = app.add_subcommand("worker", "Run one engine of a disaggregated cluster");
  cmd->add_option("--role", f.role, "prefill, decode or mixed")
      ->check(CLI::IsMember({"prefill", "decode", "mixed"}))->capture_default_str();
  cmd->add_option("--name", f.name, "Unique name in the cluster (default: <role>-<pid>)");
  cmd->add_option("--metadata", f.metadata, "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
      ->required();
  cmd->add_option("--model", f.model, "GGUF model file (default: the bundled SmolLM2-135M)");
  cmd->add_option("--host", f.host, "Address of the control endpoint and KV listener")->capture_default_str();
  cmd->add_option("--port", f.port, "Control port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--threads", f.threads, "Engine threads")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity in tokens")
      ->check(CLI::Range(16, 1 << 26))->capture_default_str();
  cmd->add_option("--block-tokens", f.block_tokens, "Tokens per KV block (equal on every worker)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "Sequences computed at once")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--max-batch-tokens", f.max_batch_tokens, "Tokens per forward step")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-waiting", f.max_waiting, "Queued requests beyond this are refused")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--transfer-protocols", f.protocols, "KV transfer protocols by preference")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-timeout-s", f.kv_transfer_timeout_s,
                  "A KV push batch not landed this long after submission fails")
      ->check(CLI::Range(0.01, 1e5))->capture_default_str();
  cmd->add_option("--drain-timeout-s", f.drain_timeout_s, "On SIGTERM, time given to requests in flight")
      ->check(CLI::Range(0.0, 1e5))->capture_default_str();
  cmd->add_option("--cost-profile", f.cost_profile,
                  "Cost model published for the conductor: auto (the saved profile for this model, "
                  "threads and CPU, else calibrate and save), calibrate, none, or a profile file")
      ->capture_default_str();
  return cmd;
}

CLI::App* AddProfileCommand(CLI::App& app, ProfileFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "profile", "Measure an engine's cost model (prefill and decode step times) into a profile");
  cmd->add_option("--model", f.model, "GGUF model file (default: the bundled SmolLM2-135M)");
  cmd->add_option("--threads", f.threads, "Engine threads")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--block-tokens", f.block_tokens, "Tokens per KV block")
      ->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--max-batch-tokens", f.max_batch_tokens, "Tokens per forward step (prefill chunk)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity used while measuring")
      ->check(CLI::Range(64, 1 << 26))->capture_default_str();
  cmd->add_option("--out", f.out, "Profile file to write (default: where a worker with these "
                  "settings looks for it)");
  return cmd;
}

int RunProfile(const ProfileFlags& f) {
  engine::EngineOptions eo;
  eo.model_path = f.model.empty() ? DefaultModelPath() : f.model;
  eo.threads = f.threads;
  eo.block_tokens = f.block_tokens;
  eo.kv_capacity_tokens = f.kv_cache_tokens;
  auto engine = engine::Engine::Load(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "error: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  cluster::CalibrationOptions co;
  co.max_batch_tokens = f.max_batch_tokens;
  auto model = cluster::Calibrate(**engine, co);
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const std::string path = f.out.empty() ? cluster::DefaultProfilePath(**engine, co) : f.out;
  if (path.empty()) {
    std::printf("%s\n", model->ToJson().c_str());
    return 0;
  }
  if (Status st = cluster::WriteProfile(*model, path); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", model->ToJson().c_str());
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return 0;
}

int RunWorker(const WorkerFlags& f) {
  auto log = GetLogger("worker");
  const sigset_t signals = BlockTerminationSignals();

  cluster::WorkerOptions o;
  auto role = cluster::ParseRole(f.role);
  if (!role.ok()) {
    std::fprintf(stderr, "error: %s\n", role.status().ToString().c_str());
    return 2;
  }
  o.role = *role;
  o.name = f.name.empty() ? f.role + "-" + std::to_string(::getpid()) : f.name;
  o.model_path = f.model.empty() ? DefaultModelPath() : f.model;
  o.threads = f.threads;
  o.block_tokens = f.block_tokens;
  o.kv_tokens = f.kv_cache_tokens;
  o.max_num_seqs = f.max_num_seqs;
  o.max_batch_tokens = f.max_batch_tokens;
  o.max_waiting = f.max_waiting;
  o.host = f.host;
  o.port = f.port;
  o.metadata_uri = f.metadata;
  o.kv_transfer_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.kv_transfer_timeout_s * 1000));
  o.cost_profile = f.cost_profile;
  auto names = ParseProtocolList(f.protocols);
  if (!names.ok()) {
    std::fprintf(stderr, "error: %s\n", names.status().message().c_str());
    return 2;
  }
  o.protocols.clear();
  for (const auto& n : *names) o.protocols.push_back(*transfer::ParseProtocol(n));

  auto worker = cluster::Worker::Start(o);
  if (!worker.ok()) {
    std::fprintf(stderr, "error: worker %s: %s\n", o.name.c_str(), worker.status().ToString().c_str());
    return 1;
  }
  std::atomic<bool> exited{false};
  std::thread server([&] {
    if (!(*worker)->Run()) log->error("the control server stopped unexpectedly");
    exited.store(true);
  });
  int sig = 0;
  const timespec poll{0, 200 * 1000 * 1000};
  while (!exited.load()) {
    sig = sigtimedwait(&signals, nullptr, &poll);
    if (sig > 0) break;
  }
  log->info("worker {} stopping", o.name);
  (*worker)->Stop(std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(f.drain_timeout_s * 1000)));
  server.join();
  log->flush();
  std::fflush(nullptr);
  // Engine threads and the transfer engine are torn down with the process.
  std::_Exit(sig > 0 ? 0 : 1);
}

}  // namespace tandem::app
