#include "worker_command.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "app_util.h"
#include "cluster/calibration.h"
#include "cluster/worker.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace tandem::app {

CLI::App* AddWorkerCommand(CLI::App& app, WorkerFlags& f) {
  CLI::App* cmd = app.add_subcommand("worker", "Run one engine of a disaggregated cluster");
  AddWorkerFlags(cmd, f);
  return cmd;
}

CLI::App* AddProfileCommand(CLI::App& app, ProfileFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "profile", "Measure an engine's cost model (prefill and decode step times) into a profile");
  AddModelFlag(cmd, f.model);
  cmd->add_option("--threads", f.threads, "Engine threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  AddBlockTokensFlag(cmd, f.block_tokens);
  AddMaxBatchTokensFlag(cmd, f.max_batch_tokens);
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity used while measuring")
      ->check(CLI::Range(64, 1 << 26))
      ->capture_default_str();
  cmd->add_option("--out", f.out,
                  "Profile file to write (default: where a worker with these "
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

  if (!SetUpClusterToken(f.cluster_token_file, /*generate=*/false)) return 2;
  cluster::WorkerOptions o;
  auto role = cluster::ParseRole(f.role);
  if (!role.ok()) {
    std::fprintf(stderr, "error: %s\n", role.status().ToString().c_str());
    return 2;
  }
  o.role = *role;
  o.name = f.name.empty() ? f.role + "-" + std::to_string(::getpid()) : f.name;
  WorkerKnobs knobs = f.knobs;
  int64_t kv_cache_tokens = f.kv_cache_tokens;
  if (!knobs.mock_profile.empty()) {
    auto cost = ApplyMockProfile(knobs.mock_profile, &knobs, &kv_cache_tokens);
    if (!cost.ok()) {
      std::fprintf(stderr, "error: --mock: %s\n", cost.status().ToString().c_str());
      return 2;
    }
    o.mock_cost = std::move(*cost);
  }
  o.engine.model_path = f.model.empty() ? DefaultModelPath() : f.model;
  o.engine.threads = f.threads;
  if (f.max_threads != 0 && f.max_threads < f.threads) {
    std::fprintf(stderr, "error: --max-threads (%d) is below --threads (%d)\n", f.max_threads,
                 f.threads);
    return 2;
  }
  o.engine.max_threads = f.max_threads;
  o.engine.block_tokens = knobs.block_tokens;
  o.engine.kv_capacity_tokens = static_cast<int>(std::min<int64_t>(kv_cache_tokens, 1 << 26));
  if (knobs.memory_budget_mb > 0 && !o.mock_cost) {
    // The KV cache gets what the rest of the plan leaves, at most --kv-cache-tokens.
    auto file = model::GgufFile::Open(o.engine.model_path);
    auto config =
        file.ok() ? model::ReadModelConfig(**file) : StatusOr<model::ModelConfig>(file.status());
    if (!config.ok()) {
      std::fprintf(stderr, "error: %s\n", config.status().ToString().c_str());
      return 1;
    }
    const engine::MemoryPlanInputs in =
        PlanInputs(static_cast<int64_t>((*file)->file_size()), *config, f.knobs,
                   std::max(f.threads, f.max_threads), 0, true);
    const StatusOr<int64_t> fits = KvTokensInBudget(f.knobs.memory_budget_mb, *config, in);
    if (!fits.ok()) {
      std::fprintf(stderr, "error: %s\n", fits.status().message().c_str());
      return 2;
    }
    o.engine.kv_capacity_tokens = static_cast<int>(std::min<int64_t>(*fits, f.kv_cache_tokens));
    o.scheduler.memory_budget_bytes = int64_t{f.knobs.memory_budget_mb} << 20;
  }
  o.scheduler.max_num_seqs = knobs.max_num_seqs;
  o.scheduler.max_batch_tokens = knobs.max_batch_tokens;
  o.scheduler.max_waiting = f.knobs.max_waiting;
  o.host = f.host;
  o.port = f.port;
  o.metadata_uri = f.metadata;
  o.kv_transfer_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.knobs.kv_transfer_timeout_s * 1000));
  o.cost_profile = f.knobs.cost_profile;
  o.kv_pool = f.knobs.kv_pool == "on";
  o.pool_dram_bytes = static_cast<uint64_t>(f.knobs.pool_dram_mb) << 20;
  if (!f.knobs.pool_ssd_dir.empty()) {
    o.pool_ssd_dir = f.knobs.pool_ssd_dir + "/" + o.name;
    o.pool_ssd_bytes = static_cast<uint64_t>(f.knobs.pool_ssd_gb * 1e9);
  }
  auto names = ParseProtocolList(f.knobs.transfer_protocols);
  if (!names.ok()) {
    std::fprintf(stderr, "error: %s\n", names.status().message().c_str());
    return 2;
  }
  o.protocols.clear();
  for (const auto& n : *names) o.protocols.push_back(*transfer::ParseProtocol(n));

  auto worker = cluster::Worker::Start(o);
  if (!worker.ok()) {
    std::fprintf(stderr, "error: worker %s: %s\n", o.name.c_str(),
                 worker.status().ToString().c_str());
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
                  std::chrono::milliseconds(static_cast<int64_t>(f.knobs.drain_timeout_s * 1000)));
  server.join();
  log->flush();
  std::fflush(nullptr);
  // Engine threads and the transfer engine are torn down with the process.
  std::_Exit(sig > 0 ? 0 : 1);
}

}  // namespace tandem::app
