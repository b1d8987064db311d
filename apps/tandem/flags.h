// The command-line knobs that more than one subcommand takes, each defined once (name, help,
// range, default) and registered from here. The knobs a `tandem serve` passes on to the worker
// processes it starts are one struct, WorkerKnobs, embedded in both ServeFlags and WorkerFlags,
// so that a knob added to it reaches a spawned worker without being spelled again (the worker's
// command line is generated from WorkerFlags, worker_flags.h WorkerArgv).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tandem::app {

// Engine and scheduler settings of one worker, and its side of the KV transfer.
struct WorkerKnobs {
  int block_tokens = 16;                       // tokens per KV block (equal on every worker)
  int max_num_seqs = 32;                       // sequences computed at once
  int max_batch_tokens = 256;                  // tokens per forward step (prompt chunks + decodes)
  int max_waiting = 256;                       // queued requests beyond this are refused (429)
  double drain_timeout_s = 30;                 // on SIGTERM, time given to requests in flight
  std::string transfer_protocols = "shm,tcp";  // KV transfer protocols by preference
  double kv_transfer_timeout_s = 10;           // a KV push batch not landed by then fails
  std::string cost_profile = "auto";           // cluster/calibration.h LoadOrCalibrate
  std::string kv_pool = "on";                  // use the cluster KV pool (cluster/worker.h)
  int pool_dram_mb = 256;                      // DRAM each worker contributes to it
  std::string pool_ssd_dir;                    // the pool's SSD tier: DIR/<worker name> each
  double pool_ssd_gb = 4;                      // capacity of each worker's SSD tier
  int memory_budget_mb = 0;  // each engine process's memory (engine/memory_plan.h); 0: none
  std::string mock_profile;  // mock engines that sleep per this profile (sim/profile.h); "": real

  bool operator==(const WorkerKnobs&) const = default;
};

// The planner of elastic pools (conductor/policy/planner.h), in `serve`, `conductor` and
// `simulate`.
struct PlannerKnobs {
  bool elastic = false;  // run it at all
  double interval_s = 1.0;
  double dwell_s = 10.0;
  double thread_dwell_s = 5.0;       // a resized worker keeps its thread count at least this long
  bool remove_last_prefill = false;  // serve: the last idle prefill worker may be stopped
  double remove_idle_s = 30.0;       // a prefill worker is offered for removal after this idle
  double high = 0.7;
  double low = 0.35;
  std::string hook;  // orchestrator command (conductor/conductor.h planner_hook)
};
// --elastic, --planner-interval-s, --planner-dwell-s, --planner-thread-dwell-s,
// --planner-remove-last-prefill, --planner-remove-idle-s, --planner-high,
// --planner-low, --planner-hook.
void AddPlannerFlags(CLI::App* cmd, PlannerKnobs& planner);

// --block-tokens, --max-num-seqs, --max-batch-tokens, --max-waiting, --drain-timeout-s,
// --memory-budget-mb, --mock.
void AddSchedulerFlags(CLI::App* cmd, WorkerKnobs& knobs);
// --transfer-protocols, --kv-transfer-timeout-s, --cost-profile, --kv-pool, --pool-dram-mb,
// --pool-ssd-dir, --pool-ssd-gb.
void AddTransferFlags(CLI::App* cmd, WorkerKnobs& knobs);
// The command line that sets every field of `knobs` (what AddSchedulerFlags and
// AddTransferFlags parse back into an equal struct).
std::vector<std::string> WorkerKnobArgs(const WorkerKnobs& knobs);

// Single flags shared by several subcommands.
void AddModelFlag(CLI::App* cmd, std::string& model);  // --model (empty: the bundled model)
CLI::Option* AddBlockTokensFlag(CLI::App* cmd, int& block_tokens);
void AddClusterTokenFlag(CLI::App* cmd, std::string& file);  // --cluster-token-file
CLI::Option* AddMaxBatchTokensFlag(CLI::App* cmd, int& max_batch_tokens);

}  // namespace tandem::app
