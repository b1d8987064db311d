#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tandem::sim {
namespace {

using nlohmann::json;

// numpy's default percentile: linear between the closest ranks; q in [0, 100].
double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.size() == 1) return sorted[0];
  const double pos = (sorted.size() - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

json Stats(std::vector<double> v) {
  if (v.empty()) {
    return {{"count", 0},     {"mean", nullptr}, {"p50", nullptr}, {"p90", nullptr},
            {"p99", nullptr}, {"min", nullptr},  {"max", nullptr}};
  }
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {{"count", v.size()},        {"mean", sum / v.size()},   {"p50", Percentile(v, 50)},
          {"p90", Percentile(v, 90)}, {"p99", Percentile(v, 99)}, {"min", v.front()},
          {"max", v.back()}};
}

json Ms(double s) { return s < 0 ? json(nullptr) : json(s * 1000.0); }

// {slo name: met} for the given SLOs; a failed request meets none; a TBT that does not exist
// (one output token) cannot be violated.
json SloChecks(const RequestRecord& r, double slo_ttft_s, double slo_tbt_s) {
  json out = json::object();
  if (slo_ttft_s > 0) out["ttft_ms"] = r.ok && r.ttft_s <= slo_ttft_s;
  if (slo_tbt_s > 0) out["tbt_ms"] = r.ok && (r.tbt_s < 0 || r.tbt_s <= slo_tbt_s);
  return out;
}

bool MetAll(const json& checks) {
  for (const auto& [k, v] : checks.items()) {
    if (!v.get<bool>()) return false;
  }
  return true;
}

json Record(const RequestRecord& r, double slo_ttft_s, double slo_tbt_s) {
  json j = {{"index", r.index},
            {"scheduled_s", r.arrival_s},
            {"sent_s", r.arrival_s},
            {"input_tokens_target", r.input_tokens},
            {"requested_output_tokens", r.requested_output_tokens},
            {"prompt_tokens", r.input_tokens},
            {"completion_tokens", r.output_tokens},
            {"output_tokens", r.ok ? json(r.output_tokens) : json(nullptr)},
            {"output_tokens_source", "usage"},
            {"ok", r.ok},
            {"status", r.status},
            {"error", r.ok ? json(nullptr) : json(r.error)},
            {"error_kind", r.ok ? json(nullptr) : json(r.status == 504 ? "timeout" : "http")},
            {"ttft_ms", r.ok ? Ms(r.ttft_s) : json(nullptr)},
            {"tpot_ms", r.ok ? Ms(r.tpot_s) : json(nullptr)},
            {"tbt_ms", r.ok ? Ms(r.tbt_s) : json(nullptr)},
            {"e2e_ms", r.ok ? Ms(r.e2e_s) : json(nullptr)},
            {"client_wait_ms", 0.0},
            {"cached_tokens", r.cached_tokens},
            {"pool_tokens", r.pool_tokens},
            {"prefill", r.prefill},
            {"decode", r.decode},
            {"local", r.local},
            {"waited_for_kv", r.waited_for_kv},
            {"predicted_ttft_ms", r.predicted_ttft_s * 1000.0},
            {"predicted_tbt_ms", r.predicted_tbt_s * 1000.0},
            {"ttft_breakdown_ms",
             {{"kv_wait", r.kv_wait_s * 1000.0},
              {"hold", r.hold_s * 1000.0},
              {"queue", r.queue_s * 1000.0},
              {"prefill", r.prefill_s * 1000.0},
              {"transfer", r.transfer_s * 1000.0}}}};
  json gaps = json::array();
  for (float g : r.gaps_s) gaps.push_back(g * 1000.0);
  j["itl_ms"] = std::move(gaps);
  j["slo"] = SloChecks(r, slo_ttft_s, slo_tbt_s);
  j["met_all_slos"] = r.ok && MetAll(j["slo"]);
  j["met_ttft_tbt"] = j["met_all_slos"];
  return j;
}

json Summary(const SimResult& res, double slo_ttft_s, double slo_tbt_s) {
  const auto& rs = res.requests;
  int completed = 0, rejected = 0, timed_out = 0, met = 0;
  int64_t in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft, tpot, tbt, e2e, itl;
  json failures = json::array();
  for (const RequestRecord& r : rs) {
    if (r.ok) {
      ++completed;
      in_tokens += r.input_tokens;
      out_tokens += r.output_tokens;
      ttft.push_back(r.ttft_s * 1000);
      e2e.push_back(r.e2e_s * 1000);
      if (r.tpot_s >= 0) tpot.push_back(r.tpot_s * 1000);
      if (r.tbt_s >= 0) tbt.push_back(r.tbt_s * 1000);
    } else {
      if (r.status == 429 || r.status == 503) ++rejected;
      if (r.status == 504) ++timed_out;
      if (failures.size() < 50) {
        failures.push_back({{"index", r.index}, {"status", r.status}, {"error", r.error}});
      }
    }
    if (r.ok && MetAll(SloChecks(r, slo_ttft_s, slo_tbt_s))) ++met;
  }
  itl.reserve(res.gaps_s.size());
  for (float g : res.gaps_s) itl.push_back(g * 1000.0);
  const int n = static_cast<int>(rs.size());
  const double dur = std::max(res.duration_s, 1e-9);
  json slo = json::object();
  if (slo_ttft_s > 0) slo["ttft_ms"] = slo_ttft_s * 1000;
  if (slo_tbt_s > 0) slo["tbt_ms"] = slo_tbt_s * 1000;
  json s = {{"requests", n},
            {"completed", completed},
            {"failed", n - completed},
            {"rejected", rejected},
            {"timed_out", timed_out},
            {"failures", failures},
            {"short_outputs", 0},
            {"short_output_requests", json::array()},
            {"duration_s", res.duration_s},
            {"request_throughput_rps", completed / dur},
            {"input_throughput_tps", in_tokens / dur},
            {"output_throughput_tps", out_tokens / dur},
            {"total_input_tokens", in_tokens},
            {"total_output_tokens", out_tokens},
            {"prompt_tokens_counted_by_server", completed},
            {"output_tokens_from_usage", completed},
            {"slo", slo},
            {"met_all_slos", met},
            {"goodput_rps", met / dur},
            {"slo_attainment", n ? static_cast<double>(met) / n : 0.0},
            {"all_slo_attainment", n ? static_cast<double>(met) / n : 0.0}};
  s["ttft_ms"] = Stats(std::move(ttft));
  s["tpot_ms"] = Stats(std::move(tpot));
  s["itl_ms"] = Stats(std::move(itl));
  s["tbt_ms"] = Stats(std::move(tbt));
  s["e2e_ms"] = Stats(std::move(e2e));
  s["client_wait_ms"] = Stats({});
  // What the simulation itself saw.
  double busy[3] = {0, 0, 0};
  int count[3] = {0, 0, 0};
  int64_t cached = 0, computed = 0, overflow = 0, pooled = 0;
  for (const InstanceRecord& i : res.instances) {
    const int k = static_cast<int>(i.role);
    busy[k] += i.busy_s;
    count[k]++;
    cached += i.cached_tokens;
    pooled += i.pool_tokens;
    computed += i.prefill_tokens;
    overflow += i.kv_overflow_blocks;
  }
  // By each instance's role at the end (elastic instances may have changed it), and over all.
  json util = json::object();
  const char* names[3] = {"prefill", "decode", "mixed"};
  for (int k = 0; k < 3; ++k) {
    if (count[k] > 0) util[names[k]] = busy[k] / (count[k] * dur);
  }
  if (!res.instances.empty()) {
    util["all"] = (busy[0] + busy[1] + busy[2]) / (res.instances.size() * dur);
  }
  s["simulation"] = {
      {"events", res.events},
      {"placements", res.placements},
      {"kv_waits", res.kv_waits},
      {"local_prefills", res.local_prefills},
      {"prefix_cache_hit_share",
       cached + computed > 0 ? static_cast<double>(cached) / (cached + computed) : 0.0},
      {"pool_hit_share",
       cached + computed > 0 ? static_cast<double>(pooled) / (cached + computed) : 0.0},
      {"prompt_tokens_computed", computed},
      {"kv_overflow_blocks", overflow},
      {"utilisation", util},
      {"role_switches", res.role_switches},
      {"planner_decisions", res.planner_decisions},
      {"wall_s", res.wall_s}};
  return s;
}

Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) return Internal("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal("cannot write " + path.string() + ": " + ec.message());
  return OkStatus();
}

json RoleChanges(const InstanceRecord& i) {
  const char* roles[3] = {"prefill", "decode", "mixed"};
  json out = json::array();
  for (const auto& [t, role] : i.role_changes) {
    out.push_back({{"t_s", t}, {"role", roles[static_cast<int>(role)]}});
  }
  return out;
}

std::string Fmt(const json& v, int digits = 1) {
  if (v.is_null()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v.get<double>());
  return buf;
}

std::string Markdown(const json& s, const json& config) {
  std::string md = "# Simulated serving run\n\n";
  md += "- " + config.value("description", std::string("simulation")) + "\n";
  md += "- requests: " + std::to_string(s["requests"].get<int>()) + ", completed " +
        std::to_string(s["completed"].get<int>()) + ", rejected " +
        std::to_string(s["rejected"].get<int>()) + ", timed out " +
        std::to_string(s["timed_out"].get<int>()) + "\n";
  md += "- SLO attainment: " + Fmt(s["slo_attainment"].get<double>() * 100) + "%, goodput " +
        Fmt(s["goodput_rps"], 3) + " req/s\n\n";
  md += "| metric | mean | p50 | p90 | p99 |\n|---|---|---|---|---|\n";
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "tbt_ms", "e2e_ms"}) {
    const json& st = s[k];
    md += std::string("| ") + k + " | " + Fmt(st["mean"]) + " | " + Fmt(st["p50"]) + " | " +
          Fmt(st["p90"]) + " | " + Fmt(st["p99"]) + " |\n";
  }
  return md;
}

}  // namespace

std::string SummaryJson(const SimResult& result, double slo_ttft_s, double slo_tbt_s) {
  return Summary(result, slo_ttft_s, slo_tbt_s).dump(1);
}

Status WriteResults(const std::string& dir, const SimResult& res, double slo_ttft_s,
                    double slo_tbt_s, const std::string& config_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("cannot create " + dir + ": " + ec.message());
  json config = json::object();
  if (!config_json.empty()) {
    try {
      config = json::parse(config_json);
    } catch (const json::exception& e) {
      return InvalidArgument(std::string("config is not JSON: ") + e.what());
    }
  }
  const json summary = Summary(res, slo_ttft_s, slo_tbt_s);
  json requests = json::array();
  for (const RequestRecord& r : res.requests) requests.push_back(Record(r, slo_ttft_s, slo_tbt_s));
  const std::filesystem::path d(dir);
  TANDEM_RETURN_IF_ERROR(WriteFile(d / "summary.json", summary.dump(1)));
  TANDEM_RETURN_IF_ERROR(WriteFile(
      d / "results.json",
      json{{"config", config}, {"summary", summary}, {"requests", std::move(requests)}}.dump()));
  TANDEM_RETURN_IF_ERROR(WriteFile(d / "summary.md", Markdown(summary, config)));
  json util = {{"interval_s", res.utilisation_interval_s}, {"instances", json::array()}};
  const char* roles[3] = {"prefill", "decode", "mixed"};
  for (const InstanceRecord& i : res.instances) {
    util["instances"].push_back({{"name", i.name},
                                 {"role", roles[static_cast<int>(i.role)]},
                                 {"busy_s", i.busy_s},
                                 {"steps", i.steps},
                                 {"prefill_tokens", i.prefill_tokens},
                                 {"cached_tokens", i.cached_tokens},
                                 {"pool_tokens", i.pool_tokens},
                                 {"decode_tokens", i.decode_tokens},
                                 {"kv_overflow_blocks", i.kv_overflow_blocks},
                                 {"busy_share", i.busy_share},
                                 {"role_changes", RoleChanges(i)}});
  }
  return WriteFile(d / "utilisation.json", util.dump());
}

}  // namespace tandem::sim
