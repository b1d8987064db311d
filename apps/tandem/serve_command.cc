#include "serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "app_util.h"
#include "cluster/mock_step.h"
#include "cluster/supervisor.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "conductor/conductor.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "http_door/door.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "server/http_server.h"
#include "serving/local_backend.h"
#include "store/pool.h"
#include "structured/tool_call.h"
#include "transfer/metadata.h"
#include "worker_command.h"

namespace tandem::app {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point After(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The engine options that shape each engine's KV cache (the KV layout's own formulas).
engine::EngineOptions KvLayoutOptions(const ServeFlags& f) {
  engine::EngineOptions eo;
  eo.block_tokens = f.knobs.block_tokens;
  eo.max_sequences = f.knobs.max_num_seqs;
  eo.max_step_tokens = f.knobs.max_batch_tokens;
  return eo;
}

// Tokens of KV that `bytes` hold: the global layers' KV per token, after the sliding layers'
// window arena (engine::KvCacheShape) is set aside. 0 when the arena alone does not fit.
int64_t KvTokensIn(int64_t bytes, const model::ModelConfig& c, const ServeFlags& f) {
  const engine::KvCacheShape one = engine::KvShapeFor(c, KvLayoutOptions(f), f.knobs.block_tokens);
  const int64_t arena =
      one.WindowBlockBytes() * one.WindowBlocksFor(f.knobs.max_num_seqs, f.knobs.max_batch_tokens);
  // A model whose every layer slides pays nothing per position beyond its windows.
  if (one.GlobalBytesPerToken() == 0) return bytes >= arena ? int64_t{1} << 26 : 0;
  return std::max<int64_t>(0, (bytes - arena) / one.GlobalBytesPerToken());
}

// Bytes of an engine's KV cache of kv_tokens positions.
double KvMiB(int64_t kv_tokens, const model::ModelConfig& c, const ServeFlags& f) {
  return static_cast<double>(engine::PagedKvCache::RequiredBytes(
             engine::KvShapeFor(c, KvLayoutOptions(f), kv_tokens))) /
         (1 << 20);
}

}  // namespace

namespace {

// The flags `serve` and `conductor` share.
void AddFrontDoorFlags(CLI::App* cmd, ServeFlags& f) {
  AddModelFlag(cmd, f.model);
  AddClusterTokenFlag(cmd, f.cluster_token_file);
  cmd->add_option("--host", f.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", f.port, "Port to listen on")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  cmd->add_option("--threads", f.threads, "Engine worker threads (default: all cores)")
      ->check(CLI::Range(1, 256));
  AddSchedulerFlags(cmd, f.knobs);
  auto* kv_tokens =
      cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens,
                      "KV-cache capacity in tokens (default: max(16384, --max-model-len))")
          ->check(CLI::Range(1, 1 << 26));
  cmd->add_option("--kv-cache-mb", f.kv_cache_mb,
                  "KV-cache capacity in MiB (instead of --kv-cache-tokens)")
      ->check(CLI::Range(1, 1 << 22))
      ->excludes(kv_tokens);
  cmd->add_option("--max-model-len", f.max_model_len,
                  "Prompt + completion tokens per request "
                  "(default: the model's context length)")
      ->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--api-key", f.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (or env TANDEM_API_KEY)");
  cmd->add_option("--allowed-origins", f.allowed_origins,
                  "Browser origins allowed to call the API (CORS), e.g. https://a.example "
                  "https://b.example; '*' any (default), '' none")
      ->expected(1, 64)
      ->delimiter(',');
  cmd->add_option("--served-model-name", f.served_model_names,
                  "Model names clients use, the first being the main one (default: file stem)")
      ->expected(1, 16);
  cmd->add_option("--chat-template", f.chat_template_file,
                  "A Jinja chat template file used instead of the model file's "
                  "tokenizer.chat_template")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tool-call-format", f.tool_call_format,
                  "How the model writes tool calls when its chat template renders tools: auto "
                  "(read from the template), hermes, llama3_json or mistral")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral"}))
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", f.request_timeout_s, "A request fails after this long")
      ->check(CLI::Range(0.1, 1e6))
      ->capture_default_str();
  cmd->add_option("--http-threads", f.http_threads,
                  "Threads that validate, tokenize and submit requests (connections and "
                  "streams need none)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  // Scheduling of the disaggregated mode (ignored by --mode colocated).
  cmd->add_option("--placement-policy", f.placement_policy,
                  "random, load-balance, cache-aware, or cache-load (minimum predicted TTFT)")
      ->check(CLI::IsMember({"random", "load-balance", "cache-aware", "cache-load"}))
      ->capture_default_str();
  cmd->add_option("--admission", f.admission,
                  "SLO admission: none, early (reject on the predicted "
                  "TTFT/TBT now), predictive (with the decode load when the prefill ends)")
      ->check(CLI::IsMember({"none", "early", "predictive"}))
      ->capture_default_str();
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms,
                  "TTFT SLO in ms (0: none; a request's "
                  "'slo_ttft_ms' field overrides it)")
      ->check(CLI::Range(0.0, 3.6e6))
      ->capture_default_str();
  cmd->add_option("--slo-tbt-ms", f.slo_tbt_ms,
                  "Time-between-tokens SLO in ms (0: none; a request's "
                  "'slo_tbt_ms' overrides it)")
      ->check(CLI::Range(0.0, 3.6e6))
      ->capture_default_str();
  cmd->add_flag("!--no-local-prefill", f.local_prefill,
                "Never compute a prompt on its decode worker (no conditional disaggregation)");
  cmd->add_option("--pipeline-min-tokens", f.pipeline_min_tokens,
                  "Chunked pipeline-parallel prefill: a prompt with at least this many uncached "
                  "tokens is prefilled by several prefill workers at once, each a range of layers "
                  "(0: never)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--pipeline-max-stages", f.pipeline_max_stages,
                  "Prefill workers in one prefill pipeline at most")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  cmd->add_option("--pipeline-chunk-tokens", f.pipeline_chunk_tokens,
                  "Prompt positions per chunk flowing through a prefill pipeline (a shorter "
                  "prompt uses smaller chunks, so that it has at least 16, of at least 128)")
      ->check(CLI::Range(16, 1 << 20))
      ->capture_default_str();
  AddPlannerFlags(cmd, f.planner);  // ignored by --mode colocated
}

}  // namespace

CLI::App* AddServeCommand(CLI::App& app, ServeFlags& f) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  AddFrontDoorFlags(cmd, f);
  cmd->add_option("--mode", f.mode,
                  "disaggregated: prefill and decode worker processes; "
                  "colocated: one process")
      ->check(CLI::IsMember({"disaggregated", "colocated"}))
      ->capture_default_str();
  cmd->add_option("--prefill-workers", f.prefill_workers,
                  "Prefill worker processes (disaggregated)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--decode-workers", f.decode_workers, "Decode worker processes (disaggregated)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--threads-per-worker", f.threads_per_worker,
                  "Engine threads of each worker "
                  "(default: --threads divided among the workers, at least 1)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--cores", f.cores,
                  "Cores the workers may use in all: with --elastic the planner starts a worker "
                  "(of --threads-per-worker threads) when a pool needs one and cores remain, and "
                  "stops an idle one when both pools are idle (default: all cores)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service for the workers (default: one served "
                  "by this process on loopback; or etcd://HOST:PORT)");
  AddTransferFlags(cmd, f.knobs);
  return cmd;
}

CLI::App* AddConductorCommand(CLI::App& app, ServeFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "conductor",
      "Serve the OpenAI-compatible API over workers started elsewhere (tandem worker)");
  AddFrontDoorFlags(cmd, f);
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service where workers publish themselves: "
                  "etcd://HOST:PORT or http://HOST:PORT")
      ->required();
  cmd->callback([&f] {
    f.mode = "disaggregated";
    f.spawn_workers = false;
  });
  return cmd;
}

namespace {

// Serves HTTP over `backend` until SIGTERM/SIGINT (blocked by the caller), then drains.
// Returns the process exit code.
// `before_exit` runs after the drain, before the process ends (e.g. stopping workers).
int ServeHttp(const ServeFlags& f, server::ServerOptions opts, server::ModelInfo model,
              serving::GenerationBackend* backend, const sigset_t& signals,
              const std::string& description, const std::function<void()>& before_exit) {
  auto log = GetLogger("serve");
  http_door::RaiseOpenFileLimit();  // every client connection holds a descriptor
  server::HttpServer http(opts, model, backend);
  if (const Status st = http.Bind(); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
    return 1;
  }
  log->info("serving '{}' on http://{}:{}; {}{}; up to {} connections", opts.served_model_name,
            f.host, http.port(), description, opts.api_key.empty() ? "" : " (API key required)",
            http.max_connections());
  std::atomic<bool> server_exited{false};
  std::thread server_thread([&] {
    if (!http.Run()) log->error("the HTTP server stopped unexpectedly");
    server_exited.store(true);
  });

  // Wait for a signal (or the server dying).
  int sig = 0;
  const timespec poll{0, 200 * 1000 * 1000};
  while (!server_exited.load()) {
    sig = sigtimedwait(&signals, nullptr, &poll);
    if (sig > 0) break;
  }
  int rc = 0;
  if (sig > 0) {
    log->info("received {}: draining (new requests get 503), up to {:.0f} s",
              sig == SIGTERM ? "SIGTERM" : "SIGINT", f.knobs.drain_timeout_s);
    // A second signal ends the process at once.
    std::thread([signals] {
      int again = 0;
      sigwait(&signals, &again);
      std::fprintf(stderr, "received a second signal: exiting now\n");
      std::_Exit(1);
    }).detach();
  } else {
    rc = 1;
  }
  http.BeginDrain();
  const Clock::time_point deadline = After(f.knobs.drain_timeout_s);
  backend->Drain(deadline);
  if (!http.WaitIdle(std::max(deadline, Clock::now()) + std::chrono::seconds(5))) {
    log->warn("some responses were still being written at the drain deadline");
  }
  http.Stop();
  // httplib 0.11.4 lets an idle keep-alive connection hold its thread (and so Stop) for the
  // keep-alive timeout. Nothing is left to serve: give them a moment, then exit regardless.
  const Clock::time_point idle_deadline = After(1.0);
  while (!server_exited.load() && Clock::now() < idle_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (before_exit) before_exit();
  if (!server_exited.load()) {
    log->info("stopped (closing idle keep-alive connections)");
    log->flush();
    std::fflush(nullptr);
    std::_Exit(rc);  // the backend is drained; the HTTP threads may still use it, so no teardown
  }
  server_thread.join();
  log->info("stopped");
  return rc;
}

// The KV pool master's figures as metrics; `m` null: no master answered (up 0).
void AddPoolMasterMetrics(const store::PoolMasterStats* m, serving::BackendStats* s) {
  s->extra.push_back({"tandem_kv_pool_master_up",
                      "1 if the KV pool's master answered the last scrape, else 0.",
                      false,
                      {},
                      m ? 1.0 : 0.0});
  if (m == nullptr) return;
  for (const store::SegmentUsage& u : m->segments) {
    const std::vector<std::pair<std::string, std::string>> labels = {{"segment", u.name},
                                                                     {"node", u.node}};
    s->extra.push_back({"tandem_kv_pool_segment_capacity_bytes",
                        "Bytes each KV pool storage segment holds, as mounted with the master.",
                        false, labels, double(u.capacity)});
    s->extra.push_back({"tandem_kv_pool_segment_used_bytes",
                        "Bytes of each KV pool segment held by objects (stored or being written).",
                        false, labels, double(u.used)});
    s->extra.push_back({"tandem_kv_pool_segment_objects",
                        "KV blocks (replicas) stored in each KV pool segment.", false, labels,
                        double(u.objects)});
  }
  const store::MasterCounters& c = m->counters;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    s->extra.push_back({name, help, true, {}, double(v)});
  };
  counter("tandem_kv_pool_evictions_total",
          "KV pool objects evicted (least recently used) to make room.", c.evictions);
  counter("tandem_kv_pool_puts_expired_total",
          "KV pool writes whose writer never committed them (dropped at their deadline).",
          c.puts_expired);
  counter("tandem_kv_pool_objects_lost_total",
          "KV pool objects that lost their last replica (node gone or unreadable).",
          c.objects_lost);
  counter("tandem_kv_pool_hot_replicas_total",
          "Replicas added to hot KV pool objects (hot-prefix replication).", c.hot_replicas);
  counter("tandem_kv_pool_restored_objects_total",
          "KV pool objects a (re)started master took from its journal.", c.restored);
  counter("tandem_kv_pool_journal_failures_total",
          "Writes of the master's journal to the metadata service that failed (retried).",
          m->journal_failures);
}

}  // namespace

int RunServe(const ServeFlags& flags) {
  auto log = GetLogger("serve");
  ServeFlags f = flags;
  // Mock engines: the profile's instance settings replace the flags (workers do the same).
  std::optional<conductor::CostModel> mock_cost;
  if (!f.knobs.mock_profile.empty()) {
    int64_t kv = f.kv_cache_tokens;
    auto cost = ApplyMockProfile(f.knobs.mock_profile, &f.knobs, &kv);
    if (!cost.ok()) {
      std::fprintf(stderr, "error: --mock: %s\n", cost.status().ToString().c_str());
      return 2;
    }
    mock_cost = std::move(*cost);
    f.kv_cache_tokens = static_cast<int>(std::min<int64_t>(kv, 1 << 26));
  }
  // Signals are taken by sigwait; block them before any thread starts so none gets them.
  // (Worker processes unblock them after fork.)
  const sigset_t signals = BlockTerminationSignals();

  const std::string model_path = f.model.empty() ? DefaultModelPath() : f.model;
  const int threads = f.threads > 0 ? f.threads : DefaultThreads();
  // The cluster token, before any thread talks to a peer; the workers this process starts
  // inherit it through the environment (never on a command line, where `ps` shows it).
  if (!SetUpClusterToken(f.cluster_token_file, /*generate=*/f.spawn_workers)) return 2;

  // Size the context and the KV cache from the model's shape (a cheap look at the header).
  auto file = model::GgufFile::Open(model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "error: %s\n", file.status().ToString().c_str());
    return 1;
  }
  auto read_config = model::ReadModelConfig(**file);
  if (!read_config.ok()) {
    std::fprintf(stderr, "error: %s\n", read_config.status().ToString().c_str());
    return 1;
  }
  // A mock engine stands for a model of any context: its KV capacity bounds it.
  if (mock_cost && f.kv_cache_tokens > read_config->context_length) {
    read_config->context_length = f.kv_cache_tokens;
  }
  if (!f.chat_template_file.empty()) {
    std::ifstream in(f.chat_template_file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "error: --chat-template: cannot read %s\n",
                   f.chat_template_file.c_str());
      return 2;
    }
    if (auto parsed = model::ChatTemplate::Parse(text.str()); !parsed.ok()) {
      std::fprintf(stderr, "error: --chat-template %s: %s\n", f.chat_template_file.c_str(),
                   parsed.status().message().c_str());
      return 2;
    }
    read_config->chat_template = text.str();
  }
  const model::ModelConfig config = std::move(*read_config);
  int max_model_len = f.max_model_len > 0 ? f.max_model_len : config.context_length;
  if (max_model_len > config.context_length) {
    std::fprintf(stderr, "error: --max-model-len %d is larger than the model's context length %d\n",
                 max_model_len, config.context_length);
    return 2;
  }
  const bool colocated = f.mode == "colocated";
  const int n_workers = std::max(1, f.prefill_workers + f.decode_workers);
  // Threads of each engine process: this one (colocated), or each worker.
  const int engine_threads = colocated                  ? threads
                             : f.threads_per_worker > 0 ? f.threads_per_worker
                                                        : std::max(1, threads / n_workers);
  int64_t kv_tokens = std::max(16384, max_model_len);
  if (f.kv_cache_tokens > 0) kv_tokens = f.kv_cache_tokens;
  if (f.kv_cache_mb > 0) kv_tokens = KvTokensIn(int64_t{f.kv_cache_mb} << 20, config, f);
  const int64_t budget_bytes = int64_t{f.knobs.memory_budget_mb} << 20;
  if (budget_bytes > 0) {
    // The KV cache gets what the rest of the plan leaves; a KV size given as well must fit.
    const engine::MemoryPlanInputs in = PlanInputs(static_cast<int64_t>((*file)->file_size()),
                                                   config, f.knobs, engine_threads, 0, !colocated);
    const StatusOr<int64_t> fits = KvTokensInBudget(f.knobs.memory_budget_mb, config, in);
    if (!fits.ok()) {
      std::fprintf(stderr, "error: %s\n", fits.status().message().c_str());
      return 2;
    }
    if (f.kv_cache_tokens > 0 || f.kv_cache_mb > 0) {
      if (kv_tokens > *fits) {
        std::fprintf(stderr,
                     "error: a KV cache of %lld tokens does not fit --memory-budget-mb %d, "
                     "which leaves room for %lld\n",
                     static_cast<long long>(kv_tokens), f.knobs.memory_budget_mb,
                     static_cast<long long>(*fits));
        return 2;
      }
    } else {
      kv_tokens = *fits;
    }
  }
  if (kv_tokens < f.knobs.block_tokens || kv_tokens > (1 << 26)) {
    std::fprintf(stderr, "error: a KV cache of %lld tokens is out of range\n",
                 static_cast<long long>(kv_tokens));
    return 2;
  }
  if (kv_tokens < max_model_len) {
    // A request longer than the whole cache could never run: cap the context to the cache.
    log->warn(
        "the KV cache ({} tokens) is smaller than the context ({} tokens); max_model_len is "
        "capped to {}",
        kv_tokens, max_model_len, kv_tokens);
    max_model_len = static_cast<int>(kv_tokens);
  }

  server::ServerOptions opts;
  opts.host = f.host;
  opts.port = f.port;
  opts.api_key = f.api_key;
  opts.allowed_origins.clear();
  for (const std::string& origin : f.allowed_origins) {
    if (!origin.empty()) opts.allowed_origins.push_back(origin);
  }
  if (opts.api_key.empty()) {
    if (const char* env = std::getenv("TANDEM_API_KEY")) opts.api_key = env;
  }
  if (f.served_model_names.empty()) {
    opts.served_model_name = std::filesystem::path(model_path).stem().string();
  } else {
    opts.served_model_name = f.served_model_names.front();
    for (const std::string& name : f.served_model_names) {  // repeated flags accumulate
      const auto& known = opts.model_aliases;
      if (name != opts.served_model_name &&
          std::find(known.begin(), known.end(), name) == known.end()) {
        opts.model_aliases.push_back(name);
      }
    }
  }
  opts.max_model_len = max_model_len;
  opts.request_timeout_s = f.request_timeout_s;
  opts.http_threads = f.http_threads;
  if (f.tool_call_format != "auto") {
    opts.tool_call_format = structured::ToolFormatNamed(f.tool_call_format);
  }
  const double kv_mib = KvMiB(kv_tokens, config, f);

  {
    const engine::MemoryPlan plan =
        engine::PlanMemory(config, PlanInputs(static_cast<int64_t>((*file)->file_size()), config,
                                              f.knobs, engine_threads, kv_tokens, !colocated));
    log->info("memory plan of {} ({} MiB{}): {}", colocated ? "this process" : "each worker",
              plan.total() >> 20,
              budget_bytes > 0 ? fmt::format(" of a {} MiB budget", f.knobs.memory_budget_mb)
                               : std::string(),
              plan.ToString());
  }

  if (colocated) {
    engine::EngineOptions eo = KvLayoutOptions(f);
    eo.model_path = model_path;
    eo.threads = threads;
    eo.kv_capacity_tokens = static_cast<int>(kv_tokens);
    eo.chat_template = config.chat_template;
    if (mock_cost) eo.mock_step_seconds = cluster::MockStepFunction(*mock_cost);
    auto loaded = engine::Engine::Load(eo);
    if (!loaded.ok()) {
      std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    std::unique_ptr<engine::Engine> eng = std::move(*loaded);
    serving::SchedulerOptions so;
    so.max_num_seqs = f.knobs.max_num_seqs;
    so.max_batch_tokens = f.knobs.max_batch_tokens;
    so.max_waiting = f.knobs.max_waiting;
    so.memory_budget_bytes = budget_bytes;
    std::unique_ptr<serving::GenerationBackend> backend = serving::MakeLocalBackend(eng.get(), so);
    const std::string description = fmt::format(
        "colocated, threads={} max_num_seqs={} kv_cache={} tokens ({:.1f} MiB) max_model_len={} "
        "chat_template={}",
        threads, f.knobs.max_num_seqs, kv_tokens, kv_mib, max_model_len,
        eng->chat_template() ? "yes" : "no");
    const int rc =
        ServeHttp(f, opts, {&eng->tokenizer(), eng->chat_template(), eng->chat_template_error()},
                  backend.get(), signals, description, nullptr);
    backend.reset();
    return rc;
  }

  // Disaggregated: a metadata service, worker processes under a supervisor, and the conductor.
  if (auto protocols = ParseProtocolList(f.knobs.transfer_protocols); !protocols.ok()) {
    std::fprintf(stderr, "error: %s\n", protocols.status().message().c_str());
    return 2;
  }
  auto front = model::LoadTextFrontEnd(**file, config);
  if (!front.ok()) {
    std::fprintf(stderr, "error: %s\n", front.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<transfer::MetadataHttpServer> metadata_server;
  std::string metadata_uri = f.metadata;
  if (metadata_uri.empty()) {
    auto started = transfer::MetadataHttpServer::Start("127.0.0.1", 0);
    if (!started.ok()) {
      std::fprintf(stderr, "error: metadata service: %s\n", started.status().ToString().c_str());
      return 1;
    }
    metadata_server = std::move(*started);
    metadata_uri = "http://127.0.0.1:" + std::to_string(metadata_server->port());
  }
  // An external metadata service may be starting at the same time: retry for a while.
  auto metadata = transfer::OpenMetadataStore(metadata_uri);
  for (const Clock::time_point give_up = After(30);
       !metadata.ok() && metadata.status().code() == StatusCode::kUnavailable &&
       Clock::now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    metadata = transfer::OpenMetadataStore(metadata_uri);
  }
  if (!metadata.ok()) {
    std::fprintf(stderr, "error: %s\n", metadata.status().ToString().c_str());
    return 1;
  }
  // The KV pool's master, embedded (workers find it in the metadata service).
  std::unique_ptr<store::PoolMasterServer> pool_master;
  if (f.knobs.kv_pool == "on" && f.spawn_workers) {
    const std::string pool_host = f.host == "0.0.0.0" || f.host == "::" ? "127.0.0.1" : f.host;
    auto started = store::PoolMasterServer::Start(pool_host, 0, {}, *metadata);
    if (!started.ok()) {
      std::fprintf(stderr, "error: KV pool master: %s\n", started.status().ToString().c_str());
      return 1;
    }
    pool_master = std::move(*started);
  }
  conductor::ConductorOptions co;
  co.metadata = *metadata;
  co.placement = *conductor::ParsePlacementPolicy(f.placement_policy);  // checked by the flag
  co.admission = *conductor::ParseAdmissionPolicy(f.admission);
  co.local_prefill = f.local_prefill;
  co.pipeline = {.min_tokens = f.pipeline_min_tokens,
                 .max_stages = f.pipeline_max_stages,
                 .chunk_tokens = f.pipeline_chunk_tokens};
  co.slo_ttft_s = f.slo_ttft_ms / 1000.0;
  co.slo_tbt_s = f.slo_tbt_ms / 1000.0;
  co.vocab_size = config.vocab_size;
  co.max_model_len = max_model_len;
  // (Counted over every worker: with elastic pools, any of them may come to decode.)
  co.max_inflight = std::max(
      1, f.knobs.max_num_seqs * (f.decode_workers + (f.planner.elastic ? f.prefill_workers : 0)) +
             f.knobs.max_waiting);
  co.elastic = f.planner.elastic;
  co.planner_interval = std::chrono::milliseconds(static_cast<int64_t>(f.planner.interval_s * 1e3));
  co.planner.dwell_s = f.planner.dwell_s;
  co.planner.remove_idle_s = f.planner.remove_idle_s;
  co.planner.high = f.planner.high;
  co.planner.low = f.planner.low;
  co.planner_hook = f.planner.hook;
  // Elastic pools on this host: the workers' engine threads are divided within --cores.
  const int core_budget = f.cores > 0 ? f.cores : DefaultThreads();
  if (f.planner.elastic && f.spawn_workers) {
    co.core_budget = core_budget;
    // Opt-in: the last idle prefill worker may go too; its cores go to the decode workers,
    // which compute prompts themselves until the load asks for a prefill worker again.
    co.planner.remove_last_prefill = f.planner.remove_last_prefill;
    co.thread_planner = {
        .high = f.planner.high, .low = f.planner.low, .dwell_s = f.planner.thread_dwell_s};
  }
  // Elastic pools on this host: the planner's requests to add or remove a worker, carried out
  // below within --cores once the supervisor exists (and forgotten before it goes).
  struct LocalScaler {
    Mutex mu;
    std::function<void(const std::string&, const std::string&)> act TANDEM_GUARDED_BY(mu);
  };
  auto scaler = std::make_shared<LocalScaler>();
  if (f.planner.elastic && f.spawn_workers) {
    co.on_scale = [scaler](const std::string& request, const std::string& worker) {
      MutexLock lock(&scaler->mu);
      if (scaler->act) scaler->act(request, worker);
    };
  }
  if (f.planner.low >= f.planner.high) {
    std::fprintf(stderr, "error: --planner-low must be below --planner-high\n");
    return 2;
  }
  // The KV pool master's figures on /metrics: the embedded master's, or (conductor over a
  // cluster) those of the standalone master published in the metadata service.
  if (pool_master) {
    co.extra_metrics = [master = pool_master.get()](serving::BackendStats* s) {
      store::PoolMasterStats m;
      m.segments = master->Usage();
      m.counters = master->Counters();
      m.journal_failures = master->JournalFailures();
      AddPoolMasterMetrics(&m, s);
    };
  } else if (f.knobs.kv_pool == "on") {
    store::PoolDirectoryOptions po;
    po.metadata = *metadata;
    po.rpc_timeout = std::chrono::milliseconds(300);
    auto dir = store::PoolDirectory::Create(po);
    if (dir.ok()) {
      std::shared_ptr<store::PoolDirectory> directory = std::move(*dir);
      co.extra_metrics = [directory](serving::BackendStats* s) {
        auto m = directory->MasterStats(store::Clock::now() + std::chrono::milliseconds(300));
        AddPoolMasterMetrics(m.ok() ? &*m : nullptr, s);
      };
    }
  }
  auto conductor = conductor::Conductor::Start(co);
  if (!conductor.ok()) {
    std::fprintf(stderr, "error: %s\n", conductor.status().ToString().c_str());
    return 1;
  }
  const int worker_threads = engine_threads;
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  conductor::Conductor* conductor_ptr = conductor->get();
  cluster::Supervisor supervisor([conductor_ptr](const std::string& name, const std::string&) {
    conductor_ptr->CountWorkerRestart(name.rfind("prefill", 0) == 0 ? cluster::Role::kPrefill
                                                                    : cluster::Role::kDecode);
  });
  auto spawn = [&](const std::string& role, int index, int threads) {
    const std::string name = role + "-" + std::to_string(index);
    WorkerFlags worker;
    worker.role = role;
    worker.name = name;
    worker.metadata = metadata_uri;
    worker.model = model_path;
    worker.threads = threads;
    // Elastic pools: a worker may grow to every core of the budget (its threads park until
    // the thread planner gives it cores).
    worker.max_threads = f.planner.elastic ? std::max(threads, core_budget) : 0;
    worker.kv_cache_tokens = static_cast<int>(kv_tokens);
    worker.knobs = f.knobs;
    cluster::ChildSpec spec;
    spec.name = name;
    spec.argv = {self, "--log-level",
                 GetLogger("serve")->level() <= spdlog::level::info ? "info" : "warn", "worker"};
    const std::vector<std::string> args = WorkerArgv(worker);
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    return supervisor.Start(spec);
  };
  const int prefill_workers = f.spawn_workers ? f.prefill_workers : 0;
  const int decode_workers = f.spawn_workers ? f.decode_workers : 0;
  for (int i = 0; i < prefill_workers; ++i) {
    if (Status st = spawn("prefill", i, worker_threads); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  for (int i = 0; i < decode_workers; ++i) {
    if (Status st = spawn("decode", i, worker_threads); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  auto forget_scaler = [&] {
    MutexLock lock(&scaler->mu);
    scaler->act = nullptr;
  };
  // Workers started elsewhere join when they are ready; until a decode worker has, requests get
  // 503 with the reason.
  if (Status st = (*conductor)->WaitForWorkers(prefill_workers, decode_workers, After(180));
      !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
    forget_scaler();
    supervisor.StopAll(After(5));
    return 1;
  }
  // Only once the cluster is up: the planner's requests are carried out from here on.
  {
    auto next_index = std::make_shared<std::map<std::string, int>>(
        std::map<std::string, int>{{"prefill", prefill_workers}, {"decode", decode_workers}});
    // By role: whether "no core left" was logged since a worker of that role last started (the
    // planner asks again every dwell time while the pool stays loaded: said once at info).
    auto no_core_said = std::make_shared<std::map<std::string, bool>>();
    MutexLock lock(&scaler->mu);
    scaler->act = [&, next_index, no_core_said](const std::string& request,
                                                const std::string& worker) {
      auto log = GetLogger("serve");
      if (request == "remove") {
        if (supervisor.Retire(worker, After(f.knobs.drain_timeout_s)).ok()) {
          log->info("elastic pools: stopping idle worker {} (its {} cores back)", worker,
                    worker_threads);
        }
        return;
      }
      const std::string role = request == "add_prefill" ? "prefill" : "decode";
      // Cores for it: free ones, or taken back from running workers (never below one thread
      // each), held until it joins (loading and calibrating take seconds).
      const int threads = conductor_ptr->ReserveCores(worker_threads, std::chrono::minutes(3));
      if (threads <= 0) {
        bool& said = (*no_core_said)[role];
        log->log(said ? spdlog::level::debug : spdlog::level::info,
                 "elastic pools: the planner asks for a {} worker; no core left within {}", role,
                 core_budget);
        said = true;
        return;
      }
      (*no_core_said)[role] = false;
      const int index = (*next_index)[role]++;
      if (Status st = spawn(role, index, threads); !st.ok()) {
        log->warn("elastic pools: cannot start a {} worker: {}", role, st.ToString());
      } else {
        log->info("elastic pools: started {}-{} ({} threads)", role, index, threads);
      }
    };
  }
  const std::string description =
      f.spawn_workers
          ? fmt::format(
                "disaggregated{}, {} prefill + {} decode workers x {} threads, metadata {}, "
                "max_num_seqs={} kv_cache={} tokens ({:.1f} MiB) per worker, "
                "max_model_len={} chat_template={}",
                f.planner.elastic ? " (elastic pools)" : "", f.prefill_workers, f.decode_workers,
                worker_threads, metadata_uri, f.knobs.max_num_seqs, kv_tokens, kv_mib,
                max_model_len, front->chat_template ? "yes" : "no")
          : fmt::format(
                "conductor over the workers published in {}, max_model_len={} "
                "chat_template={}",
                metadata_uri, max_model_len, front->chat_template ? "yes" : "no");
  const int rc =
      ServeHttp(f, opts,
                {front->tokenizer.get(), front->chat_template ? &*front->chat_template : nullptr,
                 front->chat_template_error},
                conductor->get(), signals, description, [&] {
                  forget_scaler();
                  supervisor.StopAll(After(f.knobs.drain_timeout_s + 5));
                });
  forget_scaler();
  conductor->reset();
  return rc;
}

}  // namespace tandem::app
