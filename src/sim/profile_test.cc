#include "sim/profile.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace tandem::sim {
namespace {

ModelShape Llama3_70B() {
  ModelShape m;
  m.name = "llama3-70b";
  m.layers = 80;
  m.hidden = 8192;
  m.heads = 64;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 28672;
  m.vocab = 128256;
  return m;
}

HardwareSpec A800Node() {
  HardwareSpec h;
  h.name = "A800";
  h.gpus = 8;
  h.peak_flops = 312e12;
  h.memory_bytes_per_s = 2.039e12;
  h.memory_bytes = 80e9;
  h.allreduce_bytes_per_s = 200e9;
  h.network_bytes_per_s = 100e9;
  h.network_latency_s = 1e-4;
  return h;
}

TEST(ModelShape, Llama3_70BParametersAndKv) {
  const ModelShape m = Llama3_70B();
  // The published parameter count is 70.6 billion.
  EXPECT_NEAR(m.Params() / 1e9, 70.55, 0.1);
  // K and V, 80 layers x 8 heads x 128 values x 2 bytes each.
  EXPECT_DOUBLE_EQ(m.KvBytesPerToken(), 2.0 * 80 * 8 * 128 * 2);
}

// Every roofline time is at or above its physical limit (peak compute or bandwidth), and no
// more than the limit over the stated efficiency plus the overheads.
TEST(Roofline, TimesRespectThePhysicalLimits) {
  const ModelShape m = Llama3_70B();
  const HardwareSpec h = A800Node();
  const InstanceProfile p = Roofline(m, h);
  const double flops = h.gpus * h.peak_flops, bw = h.gpus * h.memory_bytes_per_s;
  const double weights = m.Params() * m.weight_bytes_per_param;
  // Prefill of 4096 tokens: at least 2 FLOP per parameter per token at peak.
  const double prefill = p.cost.PrefillSeconds(4096, 0);
  EXPECT_GE(prefill, 2 * m.LayerParams() * 4096 / flops);
  EXPECT_LE(prefill, 2 * m.LayerParams() * 4096 / (flops * h.prefill_mfu) * 1.5);
  // A decode step of one sequence reads every weight once.
  const double step = p.cost.DecodeStepSeconds(1, 1000);
  EXPECT_GE(step, weights / bw);
  EXPECT_LE(step, weights / (bw * h.decode_mbu) + 2 * h.launch_overhead_s + 1e-3);
  // The KV read grows the step by the context's bytes over the bandwidth (at the MBU).
  const double per_token = p.cost.DecodeStepSeconds(1, 1001) - step;
  EXPECT_NEAR(per_token, m.KvBytesPerToken() / (bw * h.decode_mbu), 1e-12);
  // KV memory: what HBM holds beyond the weights and the reserve.
  const double kv_bytes = h.gpus * h.memory_bytes * (1 - h.memory_reserved_fraction) - weights;
  EXPECT_NEAR(static_cast<double>(p.kv_capacity_tokens), kv_bytes / m.KvBytesPerToken(), 1.0);
  EXPECT_GT(p.kv_capacity_tokens, 1000000);  // over a million tokens on 640 GB
  EXPECT_EQ(p.layers, 80);
}

TEST(ParseProfile, MeasuredForm) {
  const std::string text = R"({"cost": {"prefill_base_s": 0.001, "prefill_per_token_s": 0.0002,
      "prefill_attention_s": 1e-9, "decode_base_s": 0.01, "decode_per_seq_s": 0.001,
      "decode_per_context_token_s": 1e-7, "model": "m", "threads": 1, "cpu": "c", "source": "s"},
      "instance": {"kv_capacity_tokens": 16384, "block_tokens": 16, "max_batch_tokens": 256,
                   "prefix_cache_tokens": 8192, "kv_bytes_per_token": 23040, "layers": 30,
                   "link_bytes_per_s": 5e9, "link_latency_s": 0.0002}})";
  auto p = ParseProfile(text);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_DOUBLE_EQ(p->cost.prefill_per_token_s, 0.0002);
  EXPECT_EQ(p->KvBlocks(), 1024);
  EXPECT_EQ(p->PrefixCacheBlocks(), 512);
  EXPECT_EQ(p->layers, 30);
}

TEST(ParseProfile, BadInputIsAClearError) {
  EXPECT_EQ(ParseProfile("not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProfile("[1]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProfile("{}").status().code(), StatusCode::kInvalidArgument);
  // A roofline without bandwidth.
  auto p = ParseProfile(R"({"roofline": {"model": {"layers": 1, "hidden": 8, "heads": 1,
      "kv_heads": 1, "head_dim": 8, "ffn": 16, "vocab": 10}, "hardware": {"gpus": 1,
      "peak_flops": 1e12, "memory_bytes": 1e9, "network_bytes_per_s": 1e9}}})");
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("memory_bytes_per_s"), std::string::npos);
  // A measured cost model with no KV memory.
  EXPECT_EQ(ParseProfile(R"({"cost": {"prefill_base_s": 0, "prefill_per_token_s": 1e-4,
      "prefill_attention_s": 0, "decode_base_s": 0.01, "decode_per_seq_s": 0,
      "decode_per_context_token_s": 0}})")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(LoadProfile, CheckedInProfilesLoad) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  if (src == nullptr) GTEST_SKIP() << "TANDEM_SOURCE_DIR is not set";
  for (const char* name :
       {"llama3-70b-8xa800.json", "llama3-70b-8xh200.json", "smollm2-135m-cpu-1t.json"}) {
    auto p = LoadProfile(std::string(src) + "/profiles/" + name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status().ToString();
    EXPECT_TRUE(p->cost.valid()) << name;
    EXPECT_GT(p->KvBlocks(), 0) << name;
  }
  // The H200 node is faster than the A800 node on both phases, and holds more KV.
  auto a = LoadProfile(std::string(src) + "/profiles/llama3-70b-8xa800.json");
  auto h = LoadProfile(std::string(src) + "/profiles/llama3-70b-8xh200.json");
  ASSERT_TRUE(a.ok() && h.ok());
  EXPECT_LT(h->cost.PrefillSeconds(8192, 0), a->cost.PrefillSeconds(8192, 0));
  EXPECT_LT(h->cost.DecodeStepSeconds(32, 32 * 4096), a->cost.DecodeStepSeconds(32, 32 * 4096));
  EXPECT_GT(h->kv_capacity_tokens, a->kv_capacity_tokens);
}

}  // namespace
}  // namespace tandem::sim
