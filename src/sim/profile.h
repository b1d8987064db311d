// What one simulated instance is: its engine's step times (a conductor::CostModel), its KV
// memory, its prefix cache and its links. Loaded from a JSON profile file in one of two forms:
//
//   measured: {"cost": <CostModel JSON as `tandem profile` writes it>, "instance": {...}}
//   roofline: {"roofline": {"model": {...}, "hardware": {...}}, "instance": {...}}
//
// A roofline profile derives the cost model from a model shape and a node's public peak figures
// with stated efficiencies (Roofline() below documents every formula); every constant lives in
// the file beside its source. Units: seconds, tokens, bytes, FLOP.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "conductor/policy/cost_model.h"

namespace tandem::sim {

// The shape of a transformer (decoder-only, grouped-query attention, gated FFN).
struct ModelShape {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int ffn = 0;
  int vocab = 0;
  double weight_bytes_per_param = 2;  // BF16
  double kv_bytes_per_element = 2;    // BF16 KV cache

  // Parameters of the layers' attention and FFN matrices (what every token multiplies).
  double LayerParams() const;
  // All parameters: the layers' and the input and output embeddings (norms are negligible).
  double Params() const;
  // K and V of one token over all layers (bytes).
  double KvBytesPerToken() const;
};

// One node (the unit an instance runs on): `gpus` accelerators in tensor parallel.
struct HardwareSpec {
  std::string name;
  int gpus = 1;
  double peak_flops = 0;             // per GPU, dense BF16 (FLOP/s)
  double memory_bytes_per_s = 0;     // per GPU, HBM bandwidth
  double memory_bytes = 0;           // per GPU, HBM capacity
  double allreduce_bytes_per_s = 0;  // per GPU, tensor-parallel interconnect (NVLink)
  // Achieved fractions of the peaks (the stated efficiencies).
  double prefill_mfu = 0.5;               // linear layers in prefill
  double attention_mfu = 0.35;            // attention scores and values in prefill
  double decode_mbu = 0.7;                // memory bandwidth reached by a decode step
  double decode_mfu = 0.3;                // compute of the per-sequence part of a decode step
  double launch_overhead_s = 0.004;       // per forward pass: launches, synchronisation, sampling
  double memory_reserved_fraction = 0.1;  // HBM kept for activations and the runtime
  double host_cache_bytes = 0;            // node DRAM lent to the prefix cache
  double network_bytes_per_s = 0;         // per node, to other nodes (KV transfer)
  double network_latency_s = 0;
};

struct InstanceProfile {
  conductor::CostModel cost;        // the engine's true step times
  int64_t kv_capacity_tokens = 0;   // KV memory of one instance (tokens)
  int block_tokens = 16;            // KV block and prefix-key granularity
  int max_batch_tokens = 2048;      // tokens per step (the chunk of a chunked prefill)
  int max_num_seqs = 0;             // sequences decoding at once (0: no limit but KV memory)
  int64_t prefix_cache_tokens = 0;  // prefill instances: tokens kept for reuse (host DRAM)
  double kv_bytes_per_token = 0;    // moved from prefill to decode
  int layers = 1;                   // KV is pushed layer by layer
  double link_bytes_per_s = 1e9;    // per instance, outbound and inbound
  double link_latency_s = 0.0001;
  // What the engine's step times leave out, measured end to end (bench/sim_validate.py
  // calibrates both on an idle server): the first token reaches the client this much later
  // (front door, tokenization, the hand-off's calls), and a decode step takes this much longer
  // (sampling, streaming, the serving loop).
  double ttft_overhead_s = 0;
  double step_overhead_s = 0;
  std::string description;  // where the figures come from

  int64_t KvBlocks() const { return kv_capacity_tokens / block_tokens; }
  int64_t PrefixCacheBlocks() const { return prefix_cache_tokens / block_tokens; }
};

// The cost model of `model` on `hw` by roofline:
//   prefill p1 = 2·P_layers / (G·peak·prefill_mfu) + the tensor-parallel all-reduce of two
//                activations per layer (2·L·hidden·2 bytes·2(G-1)/G per token over the
//                interconnect), where G = gpus;
//   prefill p2 = 4·L·heads·head_dim / (G·peak·attention_mfu) per (new × context) token pair;
//   prefill p0 = launch_overhead_s;
//   decode  d0 = weight bytes / (G·bw·decode_mbu) + launch_overhead_s;
//   decode  d1 = 2·(P_layers + vocab·hidden) / (G·peak·decode_mfu) (each sequence's token
//                through the layers and the output matrix);
//   decode  d2 = KV bytes per token / (G·bw·decode_mbu).
// KV capacity = G·memory·(1 - reserved) - weight bytes, over KV bytes per token.
InstanceProfile Roofline(const ModelShape& model, const HardwareSpec& hw);

StatusOr<InstanceProfile> ParseProfile(const std::string& json);
StatusOr<InstanceProfile> LoadProfile(const std::string& path);

}  // namespace tandem::sim
