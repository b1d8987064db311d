#include "cluster/protocol.h"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/json_numbers.h"

namespace tandem::cluster {
namespace {

using nlohmann::json;

// Parses JSON text, mapping every parse or type error to InvalidArgument.
template <typename T, typename Fn>
StatusOr<T> Parse(const std::string& text, const char* what, Fn fn) {
  try {
    const json j = json::parse(text);
    if (!j.is_object()) return InvalidArgument(std::string(what) + ": expected a JSON object");
    if (!JsonFloatsBounded(j)) {
      return InvalidArgument(std::string(what) + ": a number is out of range");
    }
    return fn(j);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string(what) + ": " + e.what());
  }
}

json SamplingJson(const engine::SamplingParams& s) {
  return {{"temperature", s.temperature},
          {"top_k", s.top_k},
          {"top_p", s.top_p},
          {"min_p", s.min_p},
          {"seed", s.seed},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"repetition_penalty", s.repetition_penalty},
          {"logit_bias", s.logit_bias},  // [[id, bias], ...]
          {"min_tokens", s.min_tokens},
          {"stop_token_ids", s.stop_token_ids},
          {"logprobs", s.logprobs},
          {"prompt_logprobs", s.prompt_logprobs},
          {"json_schema", s.json_schema},
          {"tool_mode", static_cast<int>(s.tool_mode)},
          {"max_tool_calls", s.max_tool_calls},
          {"tool_format", static_cast<int>(s.tool_format)}};
}

engine::SamplingParams SamplingFrom(const json& j) {
  engine::SamplingParams s;
  s.temperature = j.value("temperature", 0.0f);
  s.top_k = j.value("top_k", 0);
  s.top_p = j.value("top_p", 1.0f);
  s.min_p = j.value("min_p", 0.0f);
  s.seed = j.value("seed", uint64_t{0});
  s.presence_penalty = j.value("presence_penalty", 0.0f);
  s.frequency_penalty = j.value("frequency_penalty", 0.0f);
  s.repetition_penalty = j.value("repetition_penalty", 1.0f);
  s.logit_bias = j.value("logit_bias", std::vector<std::pair<int32_t, float>>{});
  s.min_tokens = j.value("min_tokens", 0);
  s.stop_token_ids = j.value("stop_token_ids", std::vector<int32_t>{});
  s.logprobs = j.value("logprobs", -1);
  s.prompt_logprobs = j.value("prompt_logprobs", -1);
  s.json_schema = j.value("json_schema", "");
  const int tool_mode = j.value("tool_mode", 0);
  s.tool_mode = tool_mode == 2   ? engine::SamplingParams::ToolMode::kRequired
                : tool_mode == 1 ? engine::SamplingParams::ToolMode::kAuto
                                 : engine::SamplingParams::ToolMode::kNone;
  s.max_tool_calls =
      std::clamp(j.value("max_tool_calls", 1), 1, engine::SamplingParams::kMaxToolCalls);
  const int tool_format = j.value("tool_format", 0);
  s.tool_format = tool_format == 2   ? engine::SamplingParams::ToolFormat::kMistral
                  : tool_format == 1 ? engine::SamplingParams::ToolFormat::kLlama3Json
                                     : engine::SamplingParams::ToolFormat::kHermes;
  return s;
}

// A drawn token: {"token": id} plus, with logprobs, "logprob" and "top": [[id, logprob], ...].
void PutSampled(const engine::SampledToken& t, const char* key, json* j) {
  (*j)[key] = t.token;
  (*j)["logprob"] = t.logprob;
  if (!t.top.empty()) {
    json top = json::array();
    for (const auto& a : t.top) top.push_back({a.token, a.logprob});
    (*j)["top"] = std::move(top);
  }
}

engine::SampledToken SampledFrom(const json& j, const char* key) {
  engine::SampledToken t;
  t.token = j.at(key).get<int32_t>();
  t.logprob = j.value("logprob", 0.0f);
  if (auto it = j.find("top"); it != j.end()) {
    for (const json& a : *it) t.top.push_back({a.at(0).get<int32_t>(), a.at(1).get<float>()});
  }
  return t;
}

json TargetJson(const KvTarget& t) {
  return {{"segment", t.segment},
          {"blocks", t.blocks},
          {"block_tokens", t.block_tokens},
          {"n_layers", t.n_layers},
          {"layer_slice_bytes", t.layer_slice_bytes},
          {"decode_worker", t.decode_worker},
          {"skip_blocks", t.skip_blocks},
          {"window_blocks", t.window_blocks},
          {"window_arena_offset", t.window_arena_offset},
          {"window_tokens", t.window_tokens}};
}

KvTarget TargetFrom(const json& j) {
  KvTarget t;
  t.segment = j.at("segment").get<std::string>();
  t.blocks = j.at("blocks").get<std::vector<int32_t>>();
  t.block_tokens = j.at("block_tokens").get<int>();
  t.n_layers = j.at("n_layers").get<int>();
  t.layer_slice_bytes = j.at("layer_slice_bytes").get<uint64_t>();
  t.decode_worker = j.value("decode_worker", "");
  t.skip_blocks = j.value("skip_blocks", 0);
  t.window_blocks = j.value("window_blocks", std::vector<int32_t>{});
  t.window_arena_offset = j.value("window_arena_offset", uint64_t{0});
  t.window_tokens = j.value("window_tokens", 0);
  return t;
}

StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
    if (name == StatusCodeName(static_cast<StatusCode>(c))) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

json StatsJson(const serving::BackendStats& s) {
  json plan = json::object();  // part -> bytes
  for (const auto& [part, bytes] : s.memory_plan) plan[part] = bytes;
  return {{"running", s.running},
          {"waiting", s.waiting},
          {"kv_blocks_total", s.kv_blocks_total},
          {"kv_blocks_used", s.kv_blocks_used},
          {"kv_blocks_cached", s.kv_blocks_cached},
          {"kv_window_blocks_total", s.kv_window_blocks_total},
          {"kv_window_blocks_used", s.kv_window_blocks_used},
          {"prefix_cache_hit_tokens", s.prefix_cache_hit_tokens},
          {"pool_hit_tokens", s.pool_hit_tokens},
          {"prompt_tokens", s.prompt_tokens},
          {"generated_tokens", s.generated_tokens},
          {"preemptions", s.preemptions},
          {"preempt_offloaded_tokens", s.preempt_offloaded_tokens},
          {"preempt_resumed_cache_tokens", s.preempt_resumed_cache_tokens},
          {"preempt_resumed_pool_tokens", s.preempt_resumed_pool_tokens},
          {"preempt_recomputed_tokens", s.preempt_recomputed_tokens},
          {"pool_fetches_skipped", s.pool_fetches_skipped},
          {"pool_window_misses", s.pool_window_misses},
          {"reserved_blocks", s.reserved_blocks},
          {"reservations_expired", s.reservations_expired},
          {"busy_seconds_prefill", s.busy_seconds_prefill},
          {"busy_seconds_decode", s.busy_seconds_decode},
          {"busy_core_seconds_prefill", s.busy_core_seconds_prefill},
          {"busy_core_seconds_decode", s.busy_core_seconds_decode},
          {"engine_max_threads", s.engine_max_threads},
          {"computed_tokens_prefill", s.computed_tokens_prefill},
          {"computed_tokens_decode", s.computed_tokens_decode},
          {"engine_threads", s.engine_threads},
          {"sampling_seconds", s.sampling_seconds},
          {"memory_plan", std::move(plan)},
          {"memory_budget_bytes", s.memory_budget_bytes},
          {"resident_bytes", s.resident_bytes},
          {"peak_resident_bytes", s.peak_resident_bytes}};
}

serving::BackendStats StatsFrom(const json& j) {
  serving::BackendStats s;
  s.running = j.value("running", 0);
  s.waiting = j.value("waiting", 0);
  s.kv_blocks_total = j.value("kv_blocks_total", 0);
  s.kv_blocks_used = j.value("kv_blocks_used", 0);
  s.kv_blocks_cached = j.value("kv_blocks_cached", 0);
  s.kv_window_blocks_total = j.value("kv_window_blocks_total", 0);
  s.kv_window_blocks_used = j.value("kv_window_blocks_used", 0);
  s.prefix_cache_hit_tokens = j.value("prefix_cache_hit_tokens", int64_t{0});
  s.pool_hit_tokens = j.value("pool_hit_tokens", int64_t{0});
  s.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  s.generated_tokens = j.value("generated_tokens", int64_t{0});
  s.preemptions = j.value("preemptions", int64_t{0});
  s.preempt_offloaded_tokens = j.value("preempt_offloaded_tokens", int64_t{0});
  s.preempt_resumed_cache_tokens = j.value("preempt_resumed_cache_tokens", int64_t{0});
  s.preempt_resumed_pool_tokens = j.value("preempt_resumed_pool_tokens", int64_t{0});
  s.preempt_recomputed_tokens = j.value("preempt_recomputed_tokens", int64_t{0});
  s.pool_fetches_skipped = j.value("pool_fetches_skipped", int64_t{0});
  s.pool_window_misses = j.value("pool_window_misses", int64_t{0});
  s.reserved_blocks = j.value("reserved_blocks", 0);
  s.reservations_expired = j.value("reservations_expired", int64_t{0});
  s.busy_seconds_prefill = j.value("busy_seconds_prefill", 0.0);
  s.busy_seconds_decode = j.value("busy_seconds_decode", 0.0);
  s.busy_core_seconds_prefill = j.value("busy_core_seconds_prefill", 0.0);
  s.busy_core_seconds_decode = j.value("busy_core_seconds_decode", 0.0);
  s.engine_max_threads = j.value("engine_max_threads", 0);
  s.sampling_seconds = j.value("sampling_seconds", 0.0);
  s.computed_tokens_prefill = j.value("computed_tokens_prefill", int64_t{0});
  s.computed_tokens_decode = j.value("computed_tokens_decode", int64_t{0});
  s.engine_threads = j.value("engine_threads", 0);
  if (auto plan = j.find("memory_plan"); plan != j.end() && plan->is_object()) {
    for (const auto& [part, bytes] : plan->items()) {
      if (bytes.is_number_integer()) s.memory_plan.emplace_back(part, bytes.get<int64_t>());
    }
  }
  s.memory_budget_bytes = j.value("memory_budget_bytes", int64_t{0});
  s.resident_bytes = j.value("resident_bytes", int64_t{0});
  s.peak_resident_bytes = j.value("peak_resident_bytes", int64_t{0});
  return s;
}

serving::FinishReason ReasonFrom(const std::string& name) {
  using serving::FinishReason;
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled,
                         FinishReason::kError, FinishReason::kTimeout}) {
    if (name == serving::FinishReasonName(r)) return r;
  }
  return FinishReason::kError;
}

}  // namespace

const char* RoleName(Role r) {
  switch (r) {
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
    case Role::kMixed: return "mixed";
  }
  return "unknown";
}

StatusOr<Role> ParseRole(const std::string& s) {
  if (s == "prefill") return Role::kPrefill;
  if (s == "decode") return Role::kDecode;
  if (s == "mixed") return Role::kMixed;
  return InvalidArgument("unknown role '" + s + "' (prefill, decode or mixed)");
}

std::string WorkerInfo::ToJson() const {
  return json{{"name", name},
              {"role", RoleName(role)},
              {"host", host},
              {"port", port},
              {"pid", pid},
              {"kv_segment", kv_segment},
              {"block_tokens", block_tokens},
              {"n_layers", n_layers},
              {"layer_slice_bytes", layer_slice_bytes},
              {"kv_blocks", kv_blocks},
              {"model", model},
              {"incarnation", incarnation},
              {"max_batch_tokens", max_batch_tokens},
              {"max_num_seqs", max_num_seqs},
              {"layer_windows", layer_windows},
              {"model_dim", model_dim},
              {"threads", threads},
              {"max_threads", max_threads},
              {"cost", json::parse(cost.ToJson())}}
      .dump();
}

StatusOr<WorkerInfo> WorkerInfo::FromJson(const std::string& text) {
  return Parse<WorkerInfo>(text, "worker info", [](const json& j) -> StatusOr<WorkerInfo> {
    WorkerInfo w;
    w.name = j.at("name").get<std::string>();
    TANDEM_ASSIGN_OR_RETURN(w.role, ParseRole(j.at("role").get<std::string>()));
    w.host = j.at("host").get<std::string>();
    w.port = j.at("port").get<int>();
    w.pid = j.value("pid", 0);
    w.kv_segment = j.value("kv_segment", "");
    w.block_tokens = j.value("block_tokens", 0);
    w.n_layers = j.value("n_layers", 0);
    w.layer_slice_bytes = j.value("layer_slice_bytes", uint64_t{0});
    w.kv_blocks = j.value("kv_blocks", 0);
    w.model = j.value("model", "");
    w.incarnation = j.value("incarnation", int64_t{0});
    w.max_batch_tokens = j.value("max_batch_tokens", 256);
    w.max_num_seqs = j.value("max_num_seqs", 0);
    w.layer_windows = j.value("layer_windows", std::vector<int>{});
    w.model_dim = j.value("model_dim", 0);
    w.threads = j.value("threads", 0);
    w.max_threads = j.value("max_threads", 0);
    if (j.contains("cost")) {
      auto cost = conductor::CostModel::FromJson(j.at("cost").dump());
      if (cost.ok()) w.cost = std::move(*cost);  // an unreadable profile: no predictions
    }
    if (w.name.empty() || w.port <= 0 || w.port > 65535) {
      return InvalidArgument("worker info needs a name and a valid port");
    }
    return w;
  });
}

std::string WorkerStats::ToJson() const {
  const json p = {{"enabled", pool_enabled},
                  {"namespace", pool_namespace},
                  {"get_calls", pool.get_calls},
                  {"hit_objects", pool.hit_objects},
                  {"miss_calls", pool.miss_calls},
                  {"bytes_fetched", pool.bytes_fetched},
                  {"fetch_seconds", pool.fetch_seconds},
                  {"fetch_failures", pool.fetch_failures},
                  {"put_objects", pool.put_objects},
                  {"put_existing", pool.put_existing},
                  {"put_no_space", pool.put_no_space},
                  {"put_failures", pool.put_failures},
                  {"bytes_put", pool.bytes_put},
                  {"master_unavailable", pool.master_unavailable},
                  {"dram_bytes", pool.dram_bytes},
                  {"checksum_failures", pool.checksum_failures},
                  {"hot_copies", pool.hot_copies},
                  {"ssd_capacity_bytes", pool.ssd_capacity_bytes},
                  {"ssd_used_bytes", pool.ssd_used_bytes},
                  {"ssd_hit_objects", pool.ssd_hit_objects},
                  {"ssd_written_objects", pool.ssd_written_objects},
                  {"ssd_dropped_objects", pool.ssd_dropped_objects},
                  {"ssd_corrupt_objects", pool.ssd_corrupt_objects},
                  {"ssd_evictions", pool.ssd_evictions}};
  return json{{"backend", StatsJson(backend)},          {"kv_bytes_pushed", kv_bytes_pushed},
              {"transfer_failures", transfer_failures}, {"transfer_timeouts", transfer_timeouts},
              {"kv_wait_timeouts", kv_wait_timeouts},   {"auth_refusals", auth_refusals},
              {"cached_block_keys", cached_block_keys}, {"pool", p}}
      .dump();
}

StatusOr<WorkerStats> WorkerStats::FromJson(const std::string& text) {
  return Parse<WorkerStats>(text, "worker stats", [](const json& j) -> StatusOr<WorkerStats> {
    WorkerStats s;
    s.backend = StatsFrom(j.at("backend"));
    s.kv_bytes_pushed = j.value("kv_bytes_pushed", uint64_t{0});
    s.transfer_failures = j.value("transfer_failures", uint64_t{0});
    s.transfer_timeouts = j.value("transfer_timeouts", uint64_t{0});
    s.kv_wait_timeouts = j.value("kv_wait_timeouts", uint64_t{0});
    s.auth_refusals = j.value("auth_refusals", uint64_t{0});
    if (j.contains("cached_block_keys")) {
      s.cached_block_keys = j.at("cached_block_keys").get<std::vector<uint64_t>>();
    }
    if (j.contains("pool")) {
      const json& p = j.at("pool");
      s.pool_enabled = p.value("enabled", false);
      s.pool_namespace = p.value("namespace", std::string());
      s.pool.get_calls = p.value("get_calls", uint64_t{0});
      s.pool.hit_objects = p.value("hit_objects", uint64_t{0});
      s.pool.miss_calls = p.value("miss_calls", uint64_t{0});
      s.pool.bytes_fetched = p.value("bytes_fetched", uint64_t{0});
      s.pool.fetch_seconds = p.value("fetch_seconds", 0.0);
      s.pool.fetch_failures = p.value("fetch_failures", uint64_t{0});
      s.pool.put_objects = p.value("put_objects", uint64_t{0});
      s.pool.put_existing = p.value("put_existing", uint64_t{0});
      s.pool.put_no_space = p.value("put_no_space", uint64_t{0});
      s.pool.put_failures = p.value("put_failures", uint64_t{0});
      s.pool.bytes_put = p.value("bytes_put", uint64_t{0});
      s.pool.master_unavailable = p.value("master_unavailable", uint64_t{0});
      s.pool.dram_bytes = p.value("dram_bytes", uint64_t{0});
      s.pool.checksum_failures = p.value("checksum_failures", uint64_t{0});
      s.pool.hot_copies = p.value("hot_copies", uint64_t{0});
      s.pool.ssd_capacity_bytes = p.value("ssd_capacity_bytes", uint64_t{0});
      s.pool.ssd_used_bytes = p.value("ssd_used_bytes", uint64_t{0});
      s.pool.ssd_hit_objects = p.value("ssd_hit_objects", uint64_t{0});
      s.pool.ssd_written_objects = p.value("ssd_written_objects", uint64_t{0});
      s.pool.ssd_dropped_objects = p.value("ssd_dropped_objects", uint64_t{0});
      s.pool.ssd_corrupt_objects = p.value("ssd_corrupt_objects", uint64_t{0});
      s.pool.ssd_evictions = p.value("ssd_evictions", uint64_t{0});
    }
    return s;
  });
}

std::string DecodeCall::ToJson() const {
  return json{{"id", id},
              {"prompt_tokens", prompt_tokens},
              {"max_tokens", max_tokens},
              {"ignore_eos", ignore_eos},
              {"sampling", SamplingJson(sampling)},
              {"timeout_ms", timeout_ms},
              {"kv_wait_ms", kv_wait_ms},
              {"local", local},
              {"reuse_prefix", reuse_prefix},
              {"resumed_output", resumed_output}}
      .dump();
}

StatusOr<DecodeCall> DecodeCall::FromJson(const std::string& text) {
  return Parse<DecodeCall>(text, "decode call", [](const json& j) -> StatusOr<DecodeCall> {
    DecodeCall c;
    c.id = j.at("id").get<std::string>();
    c.prompt_tokens = j.at("prompt_tokens").get<std::vector<int32_t>>();
    c.max_tokens = j.at("max_tokens").get<int>();
    c.ignore_eos = j.value("ignore_eos", false);
    if (j.contains("sampling")) c.sampling = SamplingFrom(j.at("sampling"));
    c.timeout_ms = j.value("timeout_ms", int64_t{600000});
    c.kv_wait_ms = j.value("kv_wait_ms", int64_t{60000});
    c.local = j.value("local", false);
    c.reuse_prefix = j.value("reuse_prefix", true);
    c.resumed_output = j.value("resumed_output", std::vector<int32_t>{});
    if (c.id.empty()) return InvalidArgument("decode call without an id");
    if (!c.resumed_output.empty() && !c.local) {
      return InvalidArgument("decode call: resumed output needs a local prompt");
    }
    if (c.timeout_ms <= 0 || c.kv_wait_ms <= 0) {
      return InvalidArgument("decode call: timeouts must be positive");
    }
    return c;
  });
}

std::string PrefillCall::ToJson() const {
  json j{{"id", id},
         {"prompt_tokens", prompt_tokens},
         {"sampling", SamplingJson(sampling)},
         {"timeout_ms", timeout_ms},
         {"target", TargetJson(target)}};
  if (stage.pipelined()) {
    j["stage"] = {{"session", stage.session},         {"index", stage.index},
                  {"stages", stage.stages},           {"begin_layer", stage.begin_layer},
                  {"end_layer", stage.end_layer},     {"chunk_tokens", stage.chunk_tokens},
                  {"next_worker", stage.next_worker}, {"next_host", stage.next_host},
                  {"next_port", stage.next_port}};
  }
  return j.dump();
}

StatusOr<PrefillCall> PrefillCall::FromJson(const std::string& text) {
  return Parse<PrefillCall>(text, "prefill call", [](const json& j) -> StatusOr<PrefillCall> {
    PrefillCall c;
    c.id = j.at("id").get<std::string>();
    c.prompt_tokens = j.at("prompt_tokens").get<std::vector<int32_t>>();
    if (j.contains("sampling")) c.sampling = SamplingFrom(j.at("sampling"));
    c.timeout_ms = j.value("timeout_ms", int64_t{600000});
    c.target = TargetFrom(j.at("target"));
    if (j.contains("stage")) {
      const json& s = j.at("stage");
      PipelineStage& st = c.stage;
      st.session = s.at("session").get<std::string>();
      st.index = s.at("index").get<int>();
      st.stages = s.at("stages").get<int>();
      st.begin_layer = s.at("begin_layer").get<int>();
      st.end_layer = s.at("end_layer").get<int>();
      st.chunk_tokens = s.at("chunk_tokens").get<int>();
      st.next_worker = s.value("next_worker", "");
      st.next_host = s.value("next_host", "");
      st.next_port = s.value("next_port", 0);
      if (st.session.empty() || st.stages < 1 || st.index < 0 || st.index >= st.stages ||
          st.begin_layer < 0 || st.end_layer <= st.begin_layer || st.chunk_tokens < 1) {
        return InvalidArgument(
            "prefill call: stage " + std::to_string(st.index) + " of " + std::to_string(st.stages) +
            " (layers " + std::to_string(st.begin_layer) + ".." + std::to_string(st.end_layer) +
            ", chunks of " + std::to_string(st.chunk_tokens) + ") is not a pipeline stage");
      }
      if (!st.last() && (st.next_host.empty() || st.next_port <= 0 || st.next_port > 65535)) {
        return InvalidArgument(
            "prefill call: a stage before the last needs the next one's address");
      }
    }
    if (c.id.empty()) return InvalidArgument("prefill call without an id");
    if (c.timeout_ms <= 0) return InvalidArgument("prefill call: timeout must be positive");
    return c;
  });
}

std::string RoleChange::ToJson() const {
  return json{{"role", RoleName(role)}, {"reason", reason}}.dump();
}

StatusOr<RoleChange> RoleChange::FromJson(const std::string& text) {
  return Parse<RoleChange>(text, "role change", [](const json& j) -> StatusOr<RoleChange> {
    RoleChange c;
    TANDEM_ASSIGN_OR_RETURN(c.role, ParseRole(j.at("role").get<std::string>()));
    c.reason = j.value("reason", "");
    return c;
  });
}

std::string RoleChangeResult::ToJson() const {
  return json{{"role", RoleName(role)},
              {"previous", RoleName(previous)},
              {"prefills_in_flight", prefills_in_flight},
              {"decodes_in_flight", decodes_in_flight}}
      .dump();
}

StatusOr<RoleChangeResult> RoleChangeResult::FromJson(const std::string& text) {
  return Parse<RoleChangeResult>(
      text, "role change result", [](const json& j) -> StatusOr<RoleChangeResult> {
        RoleChangeResult r;
        TANDEM_ASSIGN_OR_RETURN(r.role, ParseRole(j.at("role").get<std::string>()));
        TANDEM_ASSIGN_OR_RETURN(r.previous, ParseRole(j.at("previous").get<std::string>()));
        r.prefills_in_flight = j.value("prefills_in_flight", 0);
        r.decodes_in_flight = j.value("decodes_in_flight", 0);
        return r;
      });
}

std::string ThreadsChange::ToJson() const {
  return json{{"threads", threads}, {"reason", reason}}.dump();
}

StatusOr<ThreadsChange> ThreadsChange::FromJson(const std::string& text) {
  return Parse<ThreadsChange>(text, "threads change", [](const json& j) -> StatusOr<ThreadsChange> {
    ThreadsChange c;
    c.threads = j.at("threads").get<int>();
    c.reason = j.value("reason", "");
    if (c.threads < 1) return InvalidArgument("threads must be at least 1");
    return c;
  });
}

std::string ThreadsChangeResult::ToJson() const {
  return json{{"threads", threads}, {"previous", previous}}.dump();
}

StatusOr<ThreadsChangeResult> ThreadsChangeResult::FromJson(const std::string& text) {
  return Parse<ThreadsChangeResult>(text, "threads change result",
                                    [](const json& j) -> StatusOr<ThreadsChangeResult> {
                                      ThreadsChangeResult r;
                                      r.threads = j.at("threads").get<int>();
                                      r.previous = j.value("previous", 0);
                                      return r;
                                    });
}

std::string PrefillResult::ToJson() const {
  json j{{"cached_tokens", cached_tokens},
         {"queue_seconds", queue_seconds},
         {"prefill_seconds", prefill_seconds},
         {"transfer_seconds", transfer_seconds},
         {"kv_bytes", kv_bytes},
         {"stage_bytes_sent", stage_bytes_sent},
         {"stage_wait_seconds", stage_wait_seconds}};
  PutSampled(first_token, "first_token", &j);
  return j.dump();
}

StatusOr<PrefillResult> PrefillResult::FromJson(const std::string& text) {
  return Parse<PrefillResult>(text, "prefill result", [](const json& j) -> StatusOr<PrefillResult> {
    PrefillResult r;
    r.first_token = SampledFrom(j, "first_token");
    r.cached_tokens = j.value("cached_tokens", 0);
    r.queue_seconds = j.value("queue_seconds", 0.0);
    r.prefill_seconds = j.value("prefill_seconds", 0.0);
    r.transfer_seconds = j.value("transfer_seconds", 0.0);
    r.kv_bytes = j.value("kv_bytes", uint64_t{0});
    r.stage_bytes_sent = j.value("stage_bytes_sent", uint64_t{0});
    r.stage_wait_seconds = j.value("stage_wait_seconds", 0.0);
    return r;
  });
}

std::string StageInput::Encode() const {
  json j{{"id", id}, {"start", start}, {"n", n}, {"last", last}};
  if (!error.ok()) j["error"] = json::parse(ErrorJson(error)).at("error");
  std::string out = j.dump();
  out.push_back('\n');
  static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");
  out.append(reinterpret_cast<const char*>(hidden.data()), hidden.size() * sizeof(float));
  return out;
}

StatusOr<StageInput> StageInput::Decode(std::string_view body, int dim) {
  const size_t eol = body.find('\n');
  if (eol == std::string_view::npos) return InvalidArgument("stage input without a header line");
  auto header = Parse<StageInput>(
      std::string(body.substr(0, eol)), "stage input", [](const json& j) -> StatusOr<StageInput> {
        StageInput in;
        in.id = j.at("id").get<std::string>();
        in.start = j.at("start").get<int>();
        in.n = j.at("n").get<int>();
        in.last = j.value("last", false);
        if (j.contains("error")) {
          in.error = StatusFromErrorJson(json{{"error", j.at("error")}}.dump(),
                                         "the previous stage failed");
          if (in.error.ok()) in.error = Unavailable("the previous stage failed");
        }
        if (in.id.empty() || in.start < 0 || in.n < 0) {
          return InvalidArgument("stage input: an id and a non-negative chunk are needed");
        }
        return in;
      });
  if (!header.ok()) return header.status();
  StageInput in = std::move(*header);
  const std::string_view data = body.substr(eol + 1);
  if (!in.error.ok()) return in;
  if (dim <= 0 || data.size() != static_cast<size_t>(in.n) * dim * sizeof(float)) {
    return InvalidArgument("stage input: " + std::to_string(data.size()) + " bytes for " +
                           std::to_string(in.n) + " tokens of width " + std::to_string(dim));
  }
  in.hidden.resize(static_cast<size_t>(in.n) * dim);
  std::memcpy(in.hidden.data(), data.data(), data.size());
  return in;
}

std::string DecodeEvent::ToJson() const {
  json j;
  switch (kind) {
    case Kind::kReserved: j = {{"event", "reserved"}, {"target", TargetJson(reserved)}}; break;
    case Kind::kToken:
      j = {{"event", "token"}};
      PutSampled(token, "token", &j);
      break;
    case Kind::kPromptLogprobs: {
      json tokens = json::array();
      for (const auto& t : prompt_logprobs) {
        json one;
        PutSampled(t, "token", &one);
        tokens.push_back(std::move(one));
      }
      j = {{"event", "prompt_logprobs"}, {"tokens", std::move(tokens)}};
      break;
    }
    case Kind::kFinish:
      j = {{"event", "finish"},
           {"reason", serving::FinishReasonName(finish.reason)},
           {"message", finish.message},
           {"prompt_tokens", finish.prompt_tokens},
           {"completion_tokens", finish.completion_tokens},
           {"cached_prompt_tokens", finish.cached_prompt_tokens},
           {"queue_seconds", finish.queue_seconds},
           {"ttft_seconds", finish.ttft_seconds},
           {"total_seconds", finish.total_seconds},
           {"first_decode_seconds", finish.first_decode_seconds}};
      break;
    case Kind::kError:
      j = {
          {"event", "error"}, {"code", StatusCodeName(error.code())}, {"message", error.message()}};
      break;
  }
  return j.dump();
}

StatusOr<DecodeEvent> DecodeEvent::FromJson(const std::string& text) {
  return Parse<DecodeEvent>(text, "decode event", [](const json& j) -> StatusOr<DecodeEvent> {
    DecodeEvent e;
    const std::string kind = j.at("event").get<std::string>();
    if (kind == "reserved") {
      e.kind = Kind::kReserved;
      e.reserved = TargetFrom(j.at("target"));
    } else if (kind == "token") {
      e.kind = Kind::kToken;
      e.token = SampledFrom(j, "token");
    } else if (kind == "prompt_logprobs") {
      e.kind = Kind::kPromptLogprobs;
      for (const json& t : j.at("tokens")) e.prompt_logprobs.push_back(SampledFrom(t, "token"));
    } else if (kind == "finish") {
      e.kind = Kind::kFinish;
      e.finish.reason = ReasonFrom(j.at("reason").get<std::string>());
      e.finish.message = j.value("message", "");
      e.finish.prompt_tokens = j.value("prompt_tokens", 0);
      e.finish.completion_tokens = j.value("completion_tokens", 0);
      e.finish.cached_prompt_tokens = j.value("cached_prompt_tokens", 0);
      e.finish.queue_seconds = j.value("queue_seconds", 0.0);
      e.finish.ttft_seconds = j.value("ttft_seconds", 0.0);
      e.finish.total_seconds = j.value("total_seconds", 0.0);
      e.finish.first_decode_seconds = j.value("first_decode_seconds", -1.0);
    } else if (kind == "error") {
      e.kind = Kind::kError;
      e.error = Status(CodeFromName(j.value("code", "INTERNAL")), j.value("message", ""));
      if (e.error.ok()) e.error = Internal(j.value("message", "unknown error"));
    } else {
      return InvalidArgument("unknown decode event '" + kind + "'");
    }
    return e;
  });
}

std::string ErrorJson(const Status& st) {
  return json{{"error", {{"code", StatusCodeName(st.code())}, {"message", st.message()}}}}.dump();
}

Status StatusFromErrorJson(const std::string& text, const std::string& fallback) {
  try {
    const json j = json::parse(text);
    if (!JsonFloatsBounded(j)) return Internal(fallback);
    const json& e = j.at("error");
    Status st(CodeFromName(e.value("code", "INTERNAL")), e.value("message", fallback));
    return st.ok() ? Internal(fallback) : st;
  } catch (const std::exception&) {
    return Internal(fallback);
  }
}

}  // namespace tandem::cluster
