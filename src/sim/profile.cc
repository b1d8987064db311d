#include "sim/profile.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tandem::sim {
namespace {

using nlohmann::json;

template <typename T>
void Read(const json& j, const char* key, T* out) {
  if (j.contains(key)) *out = j.at(key).get<T>();
}

ModelShape ModelFromJson(const json& j) {
  ModelShape m;
  Read(j, "name", &m.name);
  Read(j, "layers", &m.layers);
  Read(j, "hidden", &m.hidden);
  Read(j, "heads", &m.heads);
  Read(j, "kv_heads", &m.kv_heads);
  Read(j, "head_dim", &m.head_dim);
  Read(j, "ffn", &m.ffn);
  Read(j, "vocab", &m.vocab);
  Read(j, "weight_bytes_per_param", &m.weight_bytes_per_param);
  Read(j, "kv_bytes_per_element", &m.kv_bytes_per_element);
  return m;
}

HardwareSpec HardwareFromJson(const json& j) {
  HardwareSpec h;
  Read(j, "name", &h.name);
  Read(j, "gpus", &h.gpus);
  Read(j, "peak_flops", &h.peak_flops);
  Read(j, "memory_bytes_per_s", &h.memory_bytes_per_s);
  Read(j, "memory_bytes", &h.memory_bytes);
  Read(j, "allreduce_bytes_per_s", &h.allreduce_bytes_per_s);
  Read(j, "prefill_mfu", &h.prefill_mfu);
  Read(j, "attention_mfu", &h.attention_mfu);
  Read(j, "decode_mbu", &h.decode_mbu);
  Read(j, "decode_mfu", &h.decode_mfu);
  Read(j, "launch_overhead_s", &h.launch_overhead_s);
  Read(j, "memory_reserved_fraction", &h.memory_reserved_fraction);
  Read(j, "host_cache_bytes", &h.host_cache_bytes);
  Read(j, "network_bytes_per_s", &h.network_bytes_per_s);
  Read(j, "network_latency_s", &h.network_latency_s);
  return h;
}

Status CheckModel(const ModelShape& m) {
  if (m.layers <= 0 || m.hidden <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.head_dim <= 0 ||
      m.ffn <= 0 || m.vocab <= 0 || m.weight_bytes_per_param <= 0 || m.kv_bytes_per_element <= 0) {
    return InvalidArgument("roofline model '" + m.name +
                           "': layers, hidden, heads, kv_heads, head_dim, ffn, vocab and the "
                           "byte sizes must all be > 0");
  }
  return OkStatus();
}

Status CheckHardware(const HardwareSpec& h) {
  const bool fractions_ok = h.prefill_mfu > 0 && h.prefill_mfu <= 1 && h.attention_mfu > 0 &&
                            h.attention_mfu <= 1 && h.decode_mbu > 0 && h.decode_mbu <= 1 &&
                            h.decode_mfu > 0 && h.decode_mfu <= 1 &&
                            h.memory_reserved_fraction >= 0 && h.memory_reserved_fraction < 1;
  if (h.gpus <= 0 || h.peak_flops <= 0 || h.memory_bytes_per_s <= 0 || h.memory_bytes <= 0 ||
      h.network_bytes_per_s <= 0 || h.network_latency_s < 0 || h.launch_overhead_s < 0 ||
      h.host_cache_bytes < 0 || !fractions_ok) {
    return InvalidArgument("roofline hardware '" + h.name +
                           "': gpus, peak_flops, memory_bytes_per_s, memory_bytes and "
                           "network_bytes_per_s must be > 0 and the efficiencies in (0, 1]");
  }
  return OkStatus();
}

Status CheckInstance(const InstanceProfile& p) {
  if (!p.cost.valid())
    return InvalidArgument("profile: the cost model has no prefill or decode time");
  if (p.block_tokens <= 0 || p.max_batch_tokens <= 0 || p.kv_capacity_tokens < p.block_tokens ||
      p.prefix_cache_tokens < 0 || p.max_num_seqs < 0 || p.kv_bytes_per_token < 0 ||
      p.layers <= 0 || p.link_bytes_per_s <= 0 || p.link_latency_s < 0 || p.ttft_overhead_s < 0 ||
      p.step_overhead_s < 0) {
    return InvalidArgument(
        "profile: block_tokens, max_batch_tokens, layers and link_bytes_per_s must be > 0, "
        "kv_capacity_tokens at least one block, the rest >= 0");
  }
  return OkStatus();
}

}  // namespace

double ModelShape::LayerParams() const {
  const double h = hidden, q = static_cast<double>(heads) * head_dim,
               kv = static_cast<double>(kv_heads) * head_dim;
  const double attention = h * q + 2 * h * kv + q * h;
  const double ffn_params = 3.0 * h * ffn;  // gate, up, down
  return layers * (attention + ffn_params);
}

double ModelShape::Params() const { return LayerParams() + 2.0 * vocab * hidden; }

double ModelShape::KvBytesPerToken() const {
  return 2.0 * layers * kv_heads * head_dim * kv_bytes_per_element;
}

InstanceProfile Roofline(const ModelShape& m, const HardwareSpec& hw) {
  const double g = hw.gpus;
  const double flops = g * hw.peak_flops;
  const double bandwidth = g * hw.memory_bytes_per_s;
  const double weight_bytes = m.Params() * m.weight_bytes_per_param;
  InstanceProfile p;
  conductor::CostModel& c = p.cost;
  double allreduce_per_token = 0;
  if (hw.gpus > 1 && hw.allreduce_bytes_per_s > 0) {
    // Two all-reduces of one activation (hidden values of 2 bytes) per layer; a ring moves
    // 2(G-1)/G of the buffer through each GPU's link.
    allreduce_per_token =
        2.0 * m.layers * m.hidden * 2.0 * 2.0 * (g - 1) / g / hw.allreduce_bytes_per_s;
  }
  c.prefill_base_s = hw.launch_overhead_s;
  c.prefill_per_token_s = 2.0 * m.LayerParams() / (flops * hw.prefill_mfu) + allreduce_per_token;
  c.prefill_attention_s = 4.0 * m.layers * m.heads * m.head_dim / (flops * hw.attention_mfu);
  c.decode_base_s = weight_bytes / (bandwidth * hw.decode_mbu) + hw.launch_overhead_s;
  c.decode_per_seq_s =
      2.0 * (m.LayerParams() + static_cast<double>(m.vocab) * m.hidden) / (flops * hw.decode_mfu) +
      allreduce_per_token;
  c.decode_per_context_token_s = m.KvBytesPerToken() / (bandwidth * hw.decode_mbu);
  c.model = m.name;
  c.threads = hw.gpus;
  c.cpu = hw.name;
  c.source = "roofline";
  p.kv_bytes_per_token = m.KvBytesPerToken();
  const double kv_bytes = g * hw.memory_bytes * (1 - hw.memory_reserved_fraction) - weight_bytes;
  p.kv_capacity_tokens = kv_bytes > 0 ? static_cast<int64_t>(kv_bytes / p.kv_bytes_per_token) : 0;
  p.prefix_cache_tokens = static_cast<int64_t>(hw.host_cache_bytes / p.kv_bytes_per_token);
  p.layers = m.layers;
  p.link_bytes_per_s = hw.network_bytes_per_s;
  p.link_latency_s = hw.network_latency_s;
  p.description = m.name + " on " + std::to_string(hw.gpus) + "x " + hw.name + " (roofline)";
  return p;
}

StatusOr<InstanceProfile> ParseProfile(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("profile is not JSON: ") + e.what());
  }
  if (!j.is_object()) return InvalidArgument("profile: expected a JSON object");
  InstanceProfile p;
  try {
    if (j.contains("roofline")) {
      const json& r = j.at("roofline");
      const ModelShape m = ModelFromJson(r.at("model"));
      const HardwareSpec h = HardwareFromJson(r.at("hardware"));
      TANDEM_RETURN_IF_ERROR(CheckModel(m));
      TANDEM_RETURN_IF_ERROR(CheckHardware(h));
      p = Roofline(m, h);
    } else if (j.contains("cost")) {
      auto cost = conductor::CostModel::FromJson(j.at("cost").dump());
      if (!cost.ok()) return cost.status().WithContext("profile 'cost'");
      p.cost = *cost;
    } else {
      return InvalidArgument("profile: needs a 'cost' or a 'roofline' object");
    }
    if (j.contains("instance")) {
      const json& i = j.at("instance");
      Read(i, "kv_capacity_tokens", &p.kv_capacity_tokens);
      Read(i, "block_tokens", &p.block_tokens);
      Read(i, "max_batch_tokens", &p.max_batch_tokens);
      Read(i, "max_num_seqs", &p.max_num_seqs);
      Read(i, "prefix_cache_tokens", &p.prefix_cache_tokens);
      Read(i, "kv_bytes_per_token", &p.kv_bytes_per_token);
      Read(i, "layers", &p.layers);
      Read(i, "link_bytes_per_s", &p.link_bytes_per_s);
      Read(i, "link_latency_s", &p.link_latency_s);
      Read(i, "ttft_overhead_s", &p.ttft_overhead_s);
      Read(i, "step_overhead_s", &p.step_overhead_s);
    }
    Read(j, "description", &p.description);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("profile: ") + e.what());
  }
  TANDEM_RETURN_IF_ERROR(CheckInstance(p));
  return p;
}

StatusOr<InstanceProfile> LoadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read profile " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto p = ParseProfile(ss.str());
  if (!p.ok()) return p.status().WithContext(path);
  return p;
}

}  // namespace tandem::sim
