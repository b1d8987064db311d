// `tandem simulate`: the conductor's scheduling over a simulated cluster (src/sim), fed by a
// Mooncake trace or a synthetic load; prints a summary and, with --out, writes the results in
// the format of `tandem bench serve`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "flags.h"

namespace tandem::app {

struct SimulateFlags {
  std::string profile;  // instance profile file (sim/profile.h)
  std::string trace;    // Mooncake JSON-lines trace; empty: synthetic
  int start = 0;
  int max_requests = 0;  // 0: all
  double speed = 1.0;    // arrivals this many times faster than the trace's
  double length_scale = 1.0;
  int trace_block_tokens = 512;
  // Synthetic load.
  int requests = 200;
  double rate = 1.0;
  int input_tokens = 2048;
  int output_tokens = 256;
  double range = 0.5;
  double shared_prefix = 0.0;
  int prefix_groups = 4;
  std::string phases;  // a shifting synthetic load (sim::ParsePhases); empty: one phase
  // Cluster and scheduling.
  int prefill = -1;  // -1: 1, or 0 with --mixed
  int decode = -1;
  int mixed = 0;
  std::string placement_policy = "cache-load";
  std::string admission = "predictive";
  bool local_prefill = true;
  double slo_ttft_ms = 0;
  double slo_tbt_ms = 0;
  double deadline_s = 600;
  double replace_interval_ms = 0;
  double engine_noise = 0;
  double predicted_scale = 1.0;
  double engine_scale = 1.0;
  int block_tokens = 0;          // 0: the trace's (scaled) block, else the profile's
  int max_batch_tokens = 0;      // 0: the profile's
  double ttft_overhead_ms = -1;  // < 0: the profile's
  double step_overhead_ms = -1;  // < 0: the profile's
  double utilisation_interval_s = 10;
  PlannerKnobs planner;   // elastic pools
  double kv_pool_gb = 0;  // the cluster KV pool's DRAM (0: none)
  uint64_t seed = 1;
  std::string out;  // results directory
  bool keep_gaps = false;
  bool json = false;          // print the summary as JSON
  bool show_profile = false;  // print the profile as derived, and exit
};

CLI::App* AddSimulateCommand(CLI::App& app, SimulateFlags& flags);
int RunSimulate(const SimulateFlags& flags);

}  // namespace tandem::app
