#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace tandem::sim {
namespace {

// Mixes a block's id into the key of the prefix before it (SplitMix64's finaliser).
uint64_t ChainKey(uint64_t previous, uint64_t id) {
  uint64_t z = previous ^ (id + 0x9e3779b97f4a7c15ULL + (previous << 6) + (previous >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<uint64_t> ChainKeys(const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> keys;
  keys.reserve(ids.size());
  uint64_t k = 0x7a6e64656d2d7369ULL;
  for (uint64_t id : ids) keys.push_back(k = ChainKey(k, id));
  return keys;
}

}  // namespace

int ScaledBlockTokens(const TraceOptions& o) {
  return std::max(1, static_cast<int>(std::lround(o.trace_block_tokens * o.length_scale)));
}

StatusOr<std::vector<SimRequest>> LoadTrace(const std::string& path, const TraceOptions& o) {
  if (o.time_scale < 0 || o.length_scale <= 0 || o.start < 0 || o.max_requests < 0) {
    return InvalidArgument("trace: time_scale >= 0, length_scale > 0, start and max_requests >= 0");
  }
  std::ifstream in(path);
  if (!in) return NotFound("cannot read trace " + path);
  std::vector<SimRequest> out;
  std::string line;
  int line_no = 0;
  double t0 = -1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line_no - 1 < o.start) continue;
    if (o.max_requests > 0 && static_cast<int>(out.size()) >= o.max_requests) break;
    SimRequest r;
    std::vector<uint64_t> ids;
    double ts = 0;
    try {
      const auto j = nlohmann::json::parse(line);
      ts = j.at("timestamp").get<double>();
      r.input_tokens = j.at("input_length").get<int>();
      r.output_tokens = j.at("output_length").get<int>();
      if (j.contains("hash_ids")) ids = j.at("hash_ids").get<std::vector<uint64_t>>();
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(path + ":" + std::to_string(line_no) + ": " + e.what());
    }
    if (r.input_tokens <= 0 || r.output_tokens < 0 || ts < 0) {
      return InvalidArgument(path + ":" + std::to_string(line_no) +
                             ": input_length must be > 0, output_length and timestamp >= 0");
    }
    if (t0 < 0) t0 = ts;
    r.index = static_cast<int>(out.size());
    r.arrival_s = (ts - t0) / 1000.0 * o.time_scale;
    r.input_tokens = std::max(1, static_cast<int>(std::lround(r.input_tokens * o.length_scale)));
    r.output_tokens = std::max(1, static_cast<int>(std::lround(r.output_tokens * o.length_scale)));
    r.keys = ChainKeys(ids);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) {
    return a.arrival_s < b.arrival_s;
  });
  for (size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int>(i);
  return out;
}

std::vector<SimRequest> Synthetic(const SyntheticOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const int groups = std::max(1, o.prefix_groups);
  std::uniform_int_distribution<int> group(0, groups - 1);
  const int bt = std::max(1, o.block_tokens);
  std::vector<SimRequest> out;
  double t = 0;
  uint64_t next_id = static_cast<uint64_t>(groups) << 32;
  for (int i = 0; i < o.requests; ++i) {
    SimRequest r;
    r.index = i;
    r.arrival_s = t;
    t += gap(rng);
    r.input_tokens =
        std::max(1, static_cast<int>(std::lround(o.input_tokens * (1 + o.range * unit(rng)))));
    r.output_tokens =
        std::max(1, static_cast<int>(std::lround(o.output_tokens * (1 + o.range * unit(rng)))));
    // Shared blocks: ids (group, block); the rest unique.
    const int blocks = (r.input_tokens + bt - 1) / bt;
    const int shared =
        static_cast<int>(std::clamp(o.shared_prefix, 0.0, 1.0) * r.input_tokens) / bt;
    const uint64_t g = static_cast<uint64_t>(group(rng));
    std::vector<uint64_t> ids;
    for (int b = 0; b < blocks; ++b)
      ids.push_back(b < shared ? (g << 32) | static_cast<uint64_t>(b) : next_id++);
    r.keys = ChainKeys(ids);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<SimRequest> Phased(const std::vector<SyntheticOptions>& phases) {
  std::vector<SimRequest> out;
  double start = 0;
  for (size_t k = 0; k < phases.size(); ++k) {
    SyntheticOptions o = phases[k];
    o.seed += k;
    std::vector<SimRequest> part = Synthetic(o);
    // A salt per phase: its keys (hashes of prefix chains) differ from every other phase's.
    const uint64_t salt = (k + 1) * 0x9E3779B97F4A7C15ull;
    for (SimRequest& r : part) {
      r.index = static_cast<int>(out.size());
      r.arrival_s += start;
      for (uint64_t& key : r.keys) key ^= salt;
      out.push_back(std::move(r));
    }
    if (!out.empty()) start = out.back().arrival_s + 1.0 / (o.rate > 0 ? o.rate : 1.0);
  }
  return out;
}

StatusOr<std::vector<SyntheticOptions>> ParsePhases(const std::string& spec,
                                                    const SyntheticOptions& base) {
  std::vector<SyntheticOptions> phases;
  std::stringstream phases_in(spec);
  std::string phase;
  while (std::getline(phases_in, phase, ';')) {
    if (phase.empty()) continue;
    SyntheticOptions o = base;
    std::stringstream fields(phase);
    std::string field;
    while (std::getline(fields, field, ',')) {
      const size_t eq = field.find('=');
      const std::string key = field.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : field.substr(eq + 1);
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end == nullptr || *end != '\0' || !(v > 0)) {
        return InvalidArgument("phase '" + phase + "': '" + field + "' is not key=positive number");
      }
      if (key == "n") {
        o.requests = static_cast<int>(v);
      } else if (key == "in") {
        o.input_tokens = static_cast<int>(v);
      } else if (key == "out") {
        o.output_tokens = static_cast<int>(v);
      } else if (key == "rate") {
        o.rate = v;
      } else {
        return InvalidArgument("phase '" + phase + "': unknown key '" + key +
                               "' (n, in, out, rate)");
      }
    }
    phases.push_back(o);
  }
  if (phases.empty()) return InvalidArgument("no phase in '" + spec + "'");
  return phases;
}

}  // namespace tandem::sim
