#include "flags.h"

#include <fmt/format.h>

namespace tandem::app {
namespace {

// Doubles on the command line with every digit they need (so that parsing gives them back).
std::string Exact(double v) { return fmt::format("{}", v); }

}  // namespace

void AddPlannerFlags(CLI::App* cmd, PlannerKnobs& p) {
  cmd->add_flag("--elastic", p.elastic,
                "Switch workers between prefill and decode as the load shifts "
                "(the planner; see --planner-*)");
  cmd->add_option("--planner-interval-s", p.interval_s,
                  "Seconds between two decisions of the planner")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  cmd->add_option("--planner-dwell-s", p.dwell_s,
                  "A worker keeps a new role at least this long; the cluster changes one role "
                  "per half of it at most")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--planner-thread-dwell-s", p.thread_dwell_s,
                  "Elastic pools on one host (serve --cores): a worker whose engine threads "
                  "changed keeps the new count at least this long (a worker starting takes "
                  "cores back at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_flag("--planner-remove-last-prefill", p.remove_last_prefill,
                "Elastic pools on one host (serve): the last prefill worker may be stopped too "
                "when both pools are idle; its cores go to the decode workers, which compute "
                "prompts themselves until the load asks for a prefill worker again (costs TBT "
                "at the next burst of prompts)");
  cmd->add_option("--planner-remove-idle-s", p.remove_idle_s,
                  "A prefill worker is offered for removal (stopped by serve, or the hook's "
                  "remove) only once its engine has computed nothing for this long")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--planner-high", p.high,
                  "A pool whose load (share of what meets the SLOs) is above this asks for a "
                  "worker")
      ->check(CLI::Range(0.01, 100.0))
      ->capture_default_str();
  cmd->add_option("--planner-low", p.low, "A pool gives a worker only while its load is below this")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--planner-hook", p.hook,
                  "Command (run with /bin/sh) that asks an external orchestrator for a worker "
                  "more or fewer when moving roles cannot help: TANDEM_PLANNER_REQUEST="
                  "add_prefill|add_decode|remove, TANDEM_PLANNER_WORKER, loads and pool sizes in "
                  "its environment; at most once per --planner-dwell-s");
}

void AddModelFlag(CLI::App* cmd, std::string& model) {
  cmd->add_option("--model", model, "GGUF model file (default: the bundled SmolLM2-135M)");
}

void AddClusterTokenFlag(CLI::App* cmd, std::string& file) {
  cmd->add_option("--cluster-token-file", file,
                  "File holding the cluster's shared secret (>= 16 bytes, mode 600): internal "
                  "endpoints then require it (default: $TANDEM_CLUSTER_TOKEN; `serve` makes a "
                  "random one for its own workers)");
}

CLI::Option* AddBlockTokensFlag(CLI::App* cmd, int& block_tokens) {
  return cmd
      ->add_option("--block-tokens", block_tokens, "Tokens per KV block (equal on every worker)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
}

CLI::Option* AddMaxBatchTokensFlag(CLI::App* cmd, int& max_batch_tokens) {
  return cmd
      ->add_option("--max-batch-tokens", max_batch_tokens,
                   "Tokens per forward step (prompt chunks + decodes)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

void AddSchedulerFlags(CLI::App* cmd, WorkerKnobs& k) {
  AddBlockTokensFlag(cmd, k.block_tokens);
  cmd->add_option("--max-num-seqs", k.max_num_seqs, "Sequences computed at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  AddMaxBatchTokensFlag(cmd, k.max_batch_tokens);
  cmd->add_option("--max-waiting", k.max_waiting, "Queued requests beyond this get 429")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--drain-timeout-s", k.drain_timeout_s,
                  "On SIGTERM, time given to requests in flight")
      ->check(CLI::Range(0.0, 1e5))
      ->capture_default_str();
  cmd->add_option("--memory-budget-mb", k.memory_budget_mb,
                  "Memory each engine process may hold, MiB: the KV cache gets what the weights, "
                  "activations, logits, sampling scratch, KV-pool segment and runtime leave of "
                  "it (a --kv-cache-tokens given as well must fit), and requests wait for KV "
                  "instead of growing the process (0: no budget; the KV cache is sized by "
                  "--kv-cache-tokens)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--mock", k.mock_profile,
                  "Mock engines: compute nothing and take the step times of this simulator "
                  "profile ({\"cost\": <`tandem profile` output>, ...} or {\"roofline\": ...}, "
                  "e.g. profiles/llama3-70b-8xa800.json), so that the conductor can be run with "
                  "dozens of workers on "
                  "a few cores. The profile's KV capacity, block tokens, max batch tokens and "
                  "max sequences replace the flags'; every sequence generates the same token")
      ->check(CLI::ExistingFile);
}

void AddTransferFlags(CLI::App* cmd, WorkerKnobs& k) {
  cmd->add_option("--transfer-protocols", k.transfer_protocols,
                  "KV transfer protocols by preference (shm, tcp, ucx)")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-timeout-s", k.kv_transfer_timeout_s,
                  "A KV push batch not landed this long after submission fails")
      ->check(CLI::Range(0.01, 1e5))
      ->capture_default_str();
  cmd->add_option("--cost-profile", k.cost_profile,
                  "Cost model published for the conductor: auto (the saved profile for this model, "
                  "threads and CPU, else calibrate and save), calibrate, none, or a profile file")
      ->capture_default_str();
  cmd->add_option("--kv-pool", k.kv_pool,
                  "Share KV blocks through the cluster KV pool: prompts fetch what the local "
                  "prefix cache lacks, finished requests offer their blocks (on, off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--pool-dram-mb", k.pool_dram_mb,
                  "Shared memory each worker contributes to the KV pool (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--pool-ssd-dir", k.pool_ssd_dir,
                  "The KV pool's SSD tier: each worker keeps the blocks it offers as checksummed "
                  "files in DIR/<worker name>, read when the DRAM pool has lost them (default: "
                  "no SSD tier)");
  cmd->add_option("--pool-ssd-gb", k.pool_ssd_gb, "Capacity of each worker's SSD tier, GB")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
}

std::vector<std::string> WorkerKnobArgs(const WorkerKnobs& k) {
  std::vector<std::string> args = {"--block-tokens",
                                   std::to_string(k.block_tokens),
                                   "--max-num-seqs",
                                   std::to_string(k.max_num_seqs),
                                   "--max-batch-tokens",
                                   std::to_string(k.max_batch_tokens),
                                   "--max-waiting",
                                   std::to_string(k.max_waiting),
                                   "--drain-timeout-s",
                                   Exact(k.drain_timeout_s),
                                   "--memory-budget-mb",
                                   std::to_string(k.memory_budget_mb),
                                   "--transfer-protocols",
                                   k.transfer_protocols,
                                   "--kv-transfer-timeout-s",
                                   Exact(k.kv_transfer_timeout_s),
                                   "--cost-profile",
                                   k.cost_profile,
                                   "--kv-pool",
                                   k.kv_pool,
                                   "--pool-dram-mb",
                                   std::to_string(k.pool_dram_mb),
                                   "--pool-ssd-gb",
                                   Exact(k.pool_ssd_gb)};
  if (!k.pool_ssd_dir.empty()) args.insert(args.end(), {"--pool-ssd-dir", k.pool_ssd_dir});
  if (!k.mock_profile.empty()) args.insert(args.end(), {"--mock", k.mock_profile});
  return args;
}

}  // namespace tandem::app
