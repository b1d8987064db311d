// `tandem serve`: the OpenAI-compatible HTTP server. Disaggregated by default: a conductor
// (cluster::Conductor + server::HttpServer) in this process and prefill / decode worker
// processes (`tandem worker`) that it supervises and restarts. --mode colocated: one
// in-process engine with continuous batching (serving::MakeLocalBackend). SIGTERM/SIGINT: stop
// accepting (503), let in-flight requests finish within --drain-timeout-s, exit 0; a second signal
// exits at once.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "flags.h"

namespace tandem::app {

struct ServeFlags {
  std::string model;  // default: the bundled model
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = 0;          // 0: all cores
  int kv_cache_tokens = 0;  // 0: max(16384, max_model_len), or from --kv-cache-mb
  int kv_cache_mb = 0;      // 0: unset
  int max_model_len = 0;    // 0: the model's context length
  std::string api_key;      // or env TANDEM_API_KEY
  std::vector<std::string> allowed_origins = {"*"};  // CORS; "" alone: none
  // The first is the name responses carry by default; all are accepted and listed. Default: the
  // model file's stem.
  std::vector<std::string> served_model_names;
  std::string chat_template_file;         // a Jinja chat template replacing the model file's
  std::string tool_call_format = "auto";  // auto (the template's), hermes, llama3_json, mistral
  double request_timeout_s = 600;
  int http_threads = 8;  // handler threads of the front door
  // Scheduling and transfer settings, the colocated engine's and each worker's (passed on).
  WorkerKnobs knobs;
  // Disaggregated mode (the default): a conductor in this process, workers as child processes.
  std::string mode = "disaggregated";  // or "colocated": one in-process engine
  int prefill_workers = 1;
  int decode_workers = 1;
  int threads_per_worker = 0;  // 0: threads / (prefill + decode workers), at least 1
  int cores = 0;               // elastic pools start workers only within it (0: all)
  std::string metadata;        // empty: an HTTP metadata service in this process
  bool spawn_workers = true;   // false for `tandem conductor`: workers run elsewhere
  // The cluster token (common/cluster_auth.h); empty: $TANDEM_CLUSTER_TOKEN, else `serve`
  // makes a random one for the workers it starts, and `conductor` runs without.
  std::string cluster_token_file;
  // The conductor's scheduling (conductor/policy/placement.h).
  std::string placement_policy = "cache-load";
  std::string admission = "predictive";
  bool local_prefill = true;  // conditional disaggregation
  double slo_ttft_ms = 0;     // 0: none (a request may set its own)
  double slo_tbt_ms = 0;
  PlannerKnobs planner;  // elastic pools
  // Chunked pipeline-parallel prefill (conductor/policy/pipeline.h): prompts with at least this
  // many tokens the decode side lacks are prefilled by a pipeline of up to
  // pipeline_max_stages prefill workers (0: never).
  int pipeline_min_tokens = 0;
  int pipeline_max_stages = 2;
  int pipeline_chunk_tokens = 1024;
};

// Registers the subcommand and its flags on `app`; the flags object must outlive parsing.
CLI::App* AddServeCommand(CLI::App& app, ServeFlags& flags);
// `tandem conductor`: the same front door and flags, over workers found in --metadata.
CLI::App* AddConductorCommand(CLI::App& app, ServeFlags& flags);
int RunServe(const ServeFlags& flags);

}  // namespace tandem::app
