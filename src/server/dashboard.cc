#include "server/dashboard.h"

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

namespace tandem::server {
namespace {

using nlohmann::json;

json HistogramJson(const Histogram::Snapshot& h) {
  return {
      {"bounds", h.upper_bounds}, {"cumulative", h.cumulative}, {"count", h.count}, {"sum", h.sum}};
}

std::string LabelValue(const serving::ExtraMetric& m, const std::string& key) {
  for (const auto& [k, v] : m.labels) {
    if (k == key) return v;
  }
  return "";
}

}  // namespace

// dashboard_page.cc (generated from dashboard.html at build time).
extern const char* const kDashboardHtml;

const std::string& DashboardPage() {
  static const std::string page = kDashboardHtml;
  return page;
}

std::string DashboardJson(const ServerMetrics::Snapshot& m, const serving::BackendStats& stats,
                          const std::string& model, const http_door::DoorStats& door) {
  json j;
  j["time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  j["model"] = model;
  json outcomes = json::object();
  for (int i = 0; i < kNumOutcomes; ++i) {
    outcomes[OutcomeName(static_cast<Outcome>(i))] = m.outcomes[i];
  }
  j["outcomes"] = std::move(outcomes);
  j["prompt_tokens"] = m.prompt_tokens;
  j["generation_tokens"] = m.generation_tokens;
  j["running"] = stats.running;
  j["waiting"] = stats.waiting;
  j["connections"] = {
      {"open", door.connections_open},
      {"accepted", door.connections_accepted},
      {"refused", door.connections_refused},
      {"timeouts", door.idle_timeouts + door.request_timeouts + door.write_timeouts}};
  j["kv"] = {{"total", stats.kv_blocks_total},
             {"used", stats.kv_blocks_used},
             {"cached", stats.kv_blocks_cached}};
  j["window_kv"] = {{"total", stats.kv_window_blocks_total}, {"used", stats.kv_window_blocks_used}};
  j["prefix_hit_tokens"] = stats.prefix_cache_hit_tokens;
  j["pool_hit_tokens"] = stats.pool_hit_tokens;
  j["preemptions"] = stats.preemptions;
  j["histograms"] = {{"ttft", HistogramJson(m.ttft)},
                     {"tpot", HistogramJson(m.tpot)},
                     {"e2e", HistogramJson(m.e2e)},
                     {"queue", HistogramJson(m.queue)}};
  // Workers: the backend's per-worker figures grouped by their "worker" label; one engine
  // (colocated) is the worker "colocated".
  std::map<std::string, json> workers;
  json others = json::array();
  for (const serving::ExtraMetric& e : stats.extra) {
    const std::string worker = LabelValue(e, "worker");
    if (worker.empty()) {
      json labels = json::object();
      for (const auto& [k, v] : e.labels) labels[k] = v;
      others.push_back({{"name", e.name}, {"labels", std::move(labels)}, {"value", e.value}});
      continue;
    }
    json& w = workers[worker];
    w["name"] = worker;
    if (const std::string role = LabelValue(e, "role"); !role.empty()) w["role"] = role;
    std::string key = e.name.rfind("tandem_worker_", 0) == 0 ? e.name.substr(14) : e.name;
    for (const char* sub : {"phase", "state"}) {
      if (const std::string v = LabelValue(e, sub); !v.empty()) key += "." + v;
    }
    w["metrics"][key] = e.value;
  }
  if (stats.engine_threads > 0) {
    json& w = workers["colocated"];
    w["name"] = "colocated";
    w["role"] = "mixed";
    w["metrics"] = {
        {"busy_seconds_total.prefill", stats.busy_seconds_prefill},
        {"busy_seconds_total.decode", stats.busy_seconds_decode},
        {"threads", stats.engine_threads},
        {"sampling_seconds_total", stats.sampling_seconds},
        {"inflight_requests", stats.running + stats.waiting},
        {"running_sequences", stats.running},
        {"kv_blocks.used", stats.kv_blocks_used},
        {"kv_blocks.cached", stats.kv_blocks_cached},
        {"kv_blocks.free", stats.kv_blocks_total - stats.kv_blocks_used - stats.kv_blocks_cached}};
  }
  j["workers"] = json::array();
  for (auto& [name, w] : workers) j["workers"].push_back(std::move(w));
  j["metrics"] = std::move(others);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tandem::server
