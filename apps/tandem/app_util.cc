#include "app_util.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/cluster_auth.h"
#include "common/logging.h"
#include "sim/profile.h"

namespace tandem::app {

std::string DefaultModelPath() {
  // Next to the binary's source tree first (build/tandem -> models/), then the working directory.
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string name = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / name)) return (dir / name).string();
    }
  }
  return name;
}

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

int DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

bool SetUpClusterToken(const std::string& file, bool generate) {
  StatusOr<bool> installed = InstallClusterTokenFrom(file);
  if (!installed.ok()) {
    std::fprintf(stderr, "error: %s\n", installed.status().ToString().c_str());
    return false;
  }
  auto log = GetLogger("auth");
  if (*installed) {
    log->info("cluster token from {}: internal endpoints require it",
              file.empty() ? std::string("$") + kClusterTokenEnv : file);
  } else if (generate) {
    ClusterToken token = ClusterToken::Generate();
    ::setenv(kClusterTokenEnv, token.secret().c_str(), /*overwrite=*/1);  // for the workers
    InstallClusterToken(std::move(token));
    log->info("cluster token: a random one for this server's own workers");
  } else {
    log->warn("no cluster token (--cluster-token-file or ${}): internal endpoints are open",
              kClusterTokenEnv);
  }
  return true;
}

}  // namespace tandem::app

namespace tandem::app {

engine::MemoryPlanInputs PlanInputs(int64_t model_file_bytes, const model::ModelConfig& config,
                                    const WorkerKnobs& knobs, int threads, int64_t kv_tokens,
                                    bool lends_pool) {
  engine::MemoryPlanInputs in;
  in.model_file_bytes = model_file_bytes;
  in.engine.threads = threads;
  in.engine.block_tokens = knobs.block_tokens;
  in.engine.max_sequences = knobs.max_num_seqs;
  in.engine.max_step_tokens = std::max(knobs.max_batch_tokens, knobs.max_num_seqs);
  in.engine.kv_capacity_tokens = static_cast<int>(kv_tokens);
  if (lends_pool && knobs.kv_pool == "on") {
    in.kv_pool_bytes = int64_t{knobs.pool_dram_mb} << 20;
  }
  return in;
}

StatusOr<int64_t> KvTokensInBudget(int budget_mb, const model::ModelConfig& config,
                                   const engine::MemoryPlanInputs& in) {
  const int64_t fits = engine::KvTokensWithin(int64_t{budget_mb} << 20, config, in);
  if (fits >= std::max(1, in.engine.block_tokens)) return fits;
  const engine::MemoryPlan rest = engine::PlanMemory(config, in);
  return InvalidArgument(fmt::format(
      "--memory-budget-mb {} leaves no room for KV: the rest of an engine process needs {:.1f} "
      "MiB ({})",
      budget_mb, static_cast<double>(rest.total()) / (1 << 20), rest.ToString()));
}

StatusOr<conductor::CostModel> ApplyMockProfile(const std::string& path, WorkerKnobs* knobs,
                                                int64_t* kv_cache_tokens) {
  TANDEM_ASSIGN_OR_RETURN(sim::InstanceProfile profile, sim::LoadProfile(path));
  if (!profile.cost.valid()) return InvalidArgument(path + ": the profile has no step times");
  knobs->block_tokens = profile.block_tokens;
  knobs->max_batch_tokens = profile.max_batch_tokens;
  if (profile.max_num_seqs > 0) knobs->max_num_seqs = profile.max_num_seqs;
  if (profile.kv_capacity_tokens > 0) *kv_cache_tokens = profile.kv_capacity_tokens;
  conductor::CostModel cost = profile.cost;
  cost.source = "mock:" + path;
  GetLogger("tandem")->info(
      "mock engines ({}): prefill {:.2f} ms + {:.4f} ms/token, decode step {:.2f} ms + {:.3f} "
      "ms/seq; KV {} tokens, blocks of {}, {} tokens and {} sequences per step",
      profile.description.empty() ? path : profile.description, cost.prefill_base_s * 1e3,
      cost.prefill_per_token_s * 1e3, cost.decode_base_s * 1e3, cost.decode_per_seq_s * 1e3,
      *kv_cache_tokens, knobs->block_tokens, knobs->max_batch_tokens, knobs->max_num_seqs);
  return cost;
}

}  // namespace tandem::app
