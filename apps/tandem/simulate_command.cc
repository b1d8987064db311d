#include "simulate_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "sim/report.h"
#include "sim/simulator.h"

namespace tandem::app {

CLI::App* AddSimulateCommand(CLI::App& app, SimulateFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Simulate a cluster scheduled by the conductor's policies (no engines run)");
  cmd->add_option("--profile", f.profile,
                  "Instance profile (JSON: a measured cost model or a "
                  "roofline of a model on a node; see sim/profiles/)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--trace", f.trace, "Mooncake trace (JSON lines); default: a synthetic load")
      ->check(CLI::ExistingFile);
  cmd->add_option("--start", f.start, "First trace line")->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-requests", f.max_requests, "Trace requests replayed (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--speed", f.speed, "Replay arrivals this many times faster")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  cmd->add_option("--length-scale", f.length_scale, "Scale the trace's input and output lengths")
      ->check(CLI::Range(1e-6, 1e3))
      ->capture_default_str();
  cmd->add_option("--trace-block-tokens", f.trace_block_tokens, "Tokens per hash id in the trace")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--requests", f.requests, "Synthetic: number of requests")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  cmd->add_option("--rate", f.rate, "Synthetic: requests per second (Poisson)")
      ->check(CLI::Range(1e-6, 1e9))
      ->capture_default_str();
  cmd->add_option("--input-tokens", f.input_tokens, "Synthetic: mean prompt length")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--output-tokens", f.output_tokens, "Synthetic: mean output length")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--range", f.range, "Synthetic: lengths uniform within +-range of the mean")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--shared-prefix", f.shared_prefix,
                  "Synthetic: share of a prompt that is one "
                  "of --prefix-groups prefixes")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--prefix-groups", f.prefix_groups, "Synthetic: distinct shared prefixes")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--phases", f.phases,
                  "Synthetic load whose mix shifts: 'n=N,in=TOKENS,out=TOKENS,rate=RPS;...' "
                  "(phases in turn; other fields from the synthetic flags)");
  cmd->add_option("--prefill", f.prefill, "Prefill instances (default 1, or 0 with --mixed)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--decode", f.decode, "Decode instances (default 1, or 0 with --mixed)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--mixed", f.mixed,
                  "Colocated instances (prefill and decode on one engine, "
                  "chunked prefill)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--placement-policy", f.placement_policy,
                  "random, load-balance, cache-aware, or cache-load (minimum predicted TTFT)")
      ->check(CLI::IsMember({"random", "load-balance", "cache-aware", "cache-load"}))
      ->capture_default_str();
  cmd->add_option("--admission", f.admission, "none, early or predictive")
      ->check(CLI::IsMember({"none", "early", "predictive"}))
      ->capture_default_str();
  cmd->add_flag("!--no-local-prefill", f.local_prefill, "No conditional disaggregation");
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms, "TTFT SLO (0: none)")
      ->check(CLI::Range(0.0, 3.6e7))
      ->capture_default_str();
  cmd->add_option("--slo-tbt-ms", f.slo_tbt_ms, "TBT SLO (0: none)")
      ->check(CLI::Range(0.0, 3.6e7))
      ->capture_default_str();
  cmd->add_option("--deadline-s", f.deadline_s, "Each request's deadline from its arrival")
      ->check(CLI::Range(1e-3, 1e9))
      ->capture_default_str();
  cmd->add_option("--replace-interval-ms", f.replace_interval_ms,
                  "Re-place held requests this "
                  "often (0: placed once)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  cmd->add_option("--engine-noise", f.engine_noise, "Sigma of a log-normal factor on every step")
      ->check(CLI::Range(0.0, 5.0))
      ->capture_default_str();
  cmd->add_option("--predicted-scale", f.predicted_scale,
                  "The conductor's cost models are the "
                  "engines' true ones times this")
      ->check(CLI::Range(1e-3, 1e3))
      ->capture_default_str();
  cmd->add_option("--engine-scale", f.engine_scale,
                  "The engines' step times are the profile's "
                  "times this (the conductor still predicts from the profile)")
      ->check(CLI::Range(1e-3, 1e3))
      ->capture_default_str();
  cmd->add_option("--block-tokens", f.block_tokens,
                  "KV block and prefix-key size (0: the trace's "
                  "scaled block, or the profile's for a synthetic load)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-batch-tokens", f.max_batch_tokens, "Tokens per step (0: the profile's)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--ttft-overhead-ms", f.ttft_overhead_ms,
                  "Delay of every first token's delivery "
                  "(default: the profile's)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--step-overhead-ms", f.step_overhead_ms,
                  "Added to every decode step "
                  "(default: the profile's)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--utilisation-interval-s", f.utilisation_interval_s,
                  "Bucket of utilisation.json")
      ->check(CLI::Range(1e-3, 1e6))
      ->capture_default_str();
  AddPlannerFlags(cmd, f.planner);
  cmd->add_option("--kv-pool-gb", f.kv_pool_gb,
                  "A cluster KV pool of this much DRAM (GB, 0: none): prefill instances read what "
                  "it holds beyond their own prefix cache over their link, and the conductor "
                  "places knowing what it holds")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "Random seed (random placement, engine noise, synthetic load)")
      ->capture_default_str();
  cmd->add_option("--out", f.out,
                  "Write results.json, summary.json, summary.md, utilisation.json here");
  cmd->add_flag("--keep-gaps", f.keep_gaps, "Keep every request's token gaps in results.json");
  cmd->add_flag("--json", f.json, "Print the summary as JSON");
  cmd->add_flag("--show-profile", f.show_profile,
                "Print the profile as the simulator uses it "
                "(a roofline's derived cost model, KV capacity, ...) and exit");
  return cmd;
}

int RunSimulate(const SimulateFlags& flags) {
  SimulateFlags f = flags;
  if (f.prefill < 0) f.prefill = f.mixed > 0 ? 0 : 1;
  if (f.decode < 0) f.decode = f.mixed > 0 ? 0 : 1;
  auto profile = sim::LoadProfile(f.profile);
  if (!profile.ok()) {
    std::fprintf(stderr, "error: %s\n", profile.status().ToString().c_str());
    return 2;
  }
  if (f.show_profile) {
    const sim::InstanceProfile& p = *profile;
    const nlohmann::json j = {{"description", p.description},
                              {"cost", nlohmann::json::parse(p.cost.ToJson())},
                              {"kv_capacity_tokens", p.kv_capacity_tokens},
                              {"block_tokens", p.block_tokens},
                              {"max_batch_tokens", p.max_batch_tokens},
                              {"max_num_seqs", p.max_num_seqs},
                              {"prefix_cache_tokens", p.prefix_cache_tokens},
                              {"kv_bytes_per_token", p.kv_bytes_per_token},
                              {"layers", p.layers},
                              {"link_bytes_per_s", p.link_bytes_per_s},
                              {"link_latency_s", p.link_latency_s},
                              {"ttft_overhead_s", p.ttft_overhead_s},
                              {"step_overhead_s", p.step_overhead_s}};
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  sim::SimOptions o;
  o.profile = *profile;
  if (o.profile.description.empty()) o.profile.description = "profile " + f.profile;
  std::vector<sim::SimRequest> workload;
  std::string workload_desc;
  if (!f.trace.empty()) {
    sim::TraceOptions t;
    t.start = f.start;
    t.max_requests = f.max_requests;
    t.time_scale = 1.0 / f.speed;
    t.length_scale = f.length_scale;
    t.trace_block_tokens = f.trace_block_tokens;
    auto loaded = sim::LoadTrace(f.trace, t);
    if (!loaded.ok()) {
      std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    workload = std::move(*loaded);
    o.profile.block_tokens = f.block_tokens > 0 ? f.block_tokens : sim::ScaledBlockTokens(t);
    workload_desc = "trace " + f.trace + " x" + std::to_string(f.speed) + " speed";
  } else {
    sim::SyntheticOptions s;
    s.requests = f.requests;
    s.rate = f.rate;
    s.input_tokens = f.input_tokens;
    s.output_tokens = f.output_tokens;
    s.range = f.range;
    s.shared_prefix = f.shared_prefix;
    s.prefix_groups = f.prefix_groups;
    if (f.block_tokens > 0) o.profile.block_tokens = f.block_tokens;
    s.block_tokens = o.profile.block_tokens;
    s.seed = f.seed;
    if (!f.phases.empty()) {
      auto phases = sim::ParsePhases(f.phases, s);
      if (!phases.ok()) {
        std::fprintf(stderr, "error: --phases: %s\n", phases.status().message().c_str());
        return 2;
      }
      workload = sim::Phased(*phases);
      workload_desc = "synthetic phases " + f.phases;
    } else {
      workload = sim::Synthetic(s);
      workload_desc = "synthetic " + std::to_string(f.requests) + " requests at " +
                      std::to_string(f.rate) + "/s";
    }
  }
  if (f.max_batch_tokens > 0) o.profile.max_batch_tokens = f.max_batch_tokens;
  if (f.ttft_overhead_ms >= 0) o.profile.ttft_overhead_s = f.ttft_overhead_ms / 1000.0;
  if (f.step_overhead_ms >= 0) o.profile.step_overhead_s = f.step_overhead_ms / 1000.0;
  o.prefill_instances = f.prefill;
  o.decode_instances = f.decode;
  o.mixed_instances = f.mixed;
  o.placement.policy = *conductor::ParsePlacementPolicy(f.placement_policy);  // checked by the flag
  o.placement.admission = *conductor::ParseAdmissionPolicy(f.admission);
  o.placement.allow_local_prefill = f.local_prefill;
  o.slo_ttft_s = f.slo_ttft_ms / 1000.0;
  o.slo_tbt_s = f.slo_tbt_ms / 1000.0;
  o.deadline_s = f.deadline_s;
  o.replace_interval_s = f.replace_interval_ms / 1000.0;
  o.engine_noise = f.engine_noise;
  o.predicted_scale = f.predicted_scale;
  o.engine_scale = f.engine_scale;
  o.utilisation_interval_s = f.utilisation_interval_s;
  o.keep_gaps = f.keep_gaps;
  o.seed = f.seed;
  if (f.kv_pool_gb > 0 && o.profile.kv_bytes_per_token > 0) {
    o.pool_tokens = static_cast<int64_t>(f.kv_pool_gb * 1e9 / o.profile.kv_bytes_per_token);
  }
  o.elastic = f.planner.elastic;
  o.planner_interval_s = f.planner.interval_s;
  o.planner.dwell_s = f.planner.dwell_s;
  o.planner.remove_idle_s = f.planner.remove_idle_s;
  o.planner.high = f.planner.high;
  o.planner.low = f.planner.low;
  auto result = sim::Simulate(workload, o);
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", result.status().ToString().c_str());
    return 2;
  }
  const std::string cluster = f.mixed > 0 && f.prefill + f.decode == 0
                                  ? std::to_string(f.mixed) + " colocated"
                                  : std::to_string(f.prefill) + "P+" + std::to_string(f.decode) +
                                        "D" +
                                        (f.mixed > 0 ? "+" + std::to_string(f.mixed) + "M" : "");
  const std::string elastic = f.planner.elastic ? " elastic" : "";
  const nlohmann::json config = {
      {"label", cluster + elastic + " " + f.placement_policy + "/" + f.admission},
      {"description", cluster + elastic + ", " + o.profile.description + ", " + workload_desc},
      {"simulated", true},
      {"profile", f.profile},
      {"workload_desc", workload_desc},
      {"prefill", f.prefill},
      {"decode", f.decode},
      {"mixed", f.mixed},
      {"placement_policy", f.placement_policy},
      {"admission", f.admission},
      {"local_prefill", f.local_prefill},
      {"elastic", f.planner.elastic},
      {"speed", f.speed},
      {"block_tokens", o.profile.block_tokens},
      {"max_batch_tokens", o.profile.max_batch_tokens},
      {"kv_capacity_tokens", o.profile.kv_capacity_tokens},
      {"seed", f.seed}};
  const std::string summary = sim::SummaryJson(*result, o.slo_ttft_s, o.slo_tbt_s);
  if (!f.out.empty()) {
    const Status st = sim::WriteResults(f.out, *result, o.slo_ttft_s, o.slo_tbt_s, config.dump());
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  if (f.json) {
    std::printf("%s\n", summary.c_str());
    return 0;
  }
  const auto s = nlohmann::json::parse(summary);
  auto ms = [](const nlohmann::json& v) { return v.is_null() ? -1.0 : v.get<double>(); };
  std::printf("%s\n", config["description"].get<std::string>().c_str());
  std::printf(
      "requests %d: completed %d, rejected %d, timed out %d; SLO attainment %.1f%%, "
      "goodput %.3f req/s\n",
      s["requests"].get<int>(), s["completed"].get<int>(), s["rejected"].get<int>(),
      s["timed_out"].get<int>(), 100 * s["slo_attainment"].get<double>(),
      s["goodput_rps"].get<double>());
  for (const char* k : {"ttft_ms", "tbt_ms", "tpot_ms", "e2e_ms"}) {
    std::printf("%-8s mean %10.1f  p50 %10.1f  p90 %10.1f  p99 %10.1f\n", k, ms(s[k]["mean"]),
                ms(s[k]["p50"]), ms(s[k]["p90"]), ms(s[k]["p99"]));
  }
  const auto& sim = s["simulation"];
  std::printf(
      "prefix cache hit share %.3f (from the KV pool %.3f); utilisation %s; %lld events "
      "in %.2f s\n",
      sim["prefix_cache_hit_share"].get<double>(), sim["pool_hit_share"].get<double>(),
      sim["utilisation"].dump().c_str(), static_cast<long long>(sim["events"].get<int64_t>()),
      sim["wall_s"].get<double>());
  if (f.planner.elastic) {
    std::printf("role switches %lld; planner decisions %s\n",
                static_cast<long long>(sim["role_switches"].get<int64_t>()),
                sim["planner_decisions"].dump().c_str());
  }
  return 0;
}

}  // namespace tandem::app
