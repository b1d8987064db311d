// The attention kernel alone, on every instruction set the CPU runs: one call of AttendTile for
// a tile of query tokens at the end of a context of random fp16 K/V in 16-position blocks, timed
// over repeats. Prints one JSON object per line: isa, shape, milliseconds per call (median) and
// GFLOP/s (4 * tokens * group * head_dim * context: Q K^T and P V, 2 flops per multiply-add).
//
//   build/bench/attention_bench --head-dim 256 --group 4 --tokens 64 --context 4096
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/attention.h"
#include "kernels/cpu_isa.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem attention kernel benchmark"};
  int head_dim = 256, group = 4, tokens = tandem::kernels::kMaxAttentionTile, repeats = 21;
  std::vector<int> contexts = {512, 4096, 32768};
  app.add_option("--head-dim", head_dim)
      ->check(CLI::Range(16, tandem::kernels::kMaxAttentionHeadDim));
  app.add_option("--group", group)->check(CLI::Range(1, tandem::kernels::kMaxAttentionGroup));
  app.add_option("--tokens", tokens, "Query tokens per call")
      ->check(CLI::Range(1, tandem::kernels::kMaxAttentionTile));
  app.add_option("--context", contexts, "Positions the last query token sees")->delimiter(',');
  app.add_option("--repeats", repeats);
  CLI11_PARSE(app, argc, argv);

  constexpr int kBlock = 16;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int context : contexts) {
    context = std::max(context, tokens);
    const int n_blocks = (context + kBlock - 1) / kBlock;
    std::vector<uint16_t> keys(static_cast<size_t>(n_blocks) * kBlock * head_dim);
    std::vector<uint16_t> values(keys.size());
    for (uint16_t& x : keys) x = tandem::Fp32ToFp16(u(rng));
    for (uint16_t& x : values) x = tandem::Fp32ToFp16(u(rng));
    std::vector<const uint16_t*> key_ptrs, value_ptrs;
    for (int b = 0; b < n_blocks; ++b) {
      key_ptrs.push_back(&keys[static_cast<size_t>(b) * kBlock * head_dim]);
      value_ptrs.push_back(&values[static_cast<size_t>(b) * kBlock * head_dim]);
    }
    const int64_t stride = static_cast<int64_t>(group) * head_dim;
    std::vector<float> q(static_cast<size_t>(tokens) * stride), out(q.size());
    for (float& x : q) x = u(rng);
    tandem::kernels::AttentionTile tile{};
    tile.keys = key_ptrs.data();
    tile.values = value_ptrs.data();
    tile.head_dim = head_dim;
    tile.block_tokens = kBlock;
    tile.group = group;
    tile.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    for (const char* isa : {"scalar", "avx2", "avx512", "amx"}) {
      if (!tandem::kernels::ForceIsa(isa)) continue;
      if (std::string(isa) == "scalar" && context > 4096) continue;  // minutes, and not news
      std::vector<double> ms;
      for (int r = 0; r < repeats + 1; ++r) {  // the first call warms up
        const auto t0 = std::chrono::steady_clock::now();
        tandem::kernels::AttendTile(tile, context - tokens, tokens, q.data(), stride, out.data(),
                                    stride);
        const double dt =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        if (r > 0) ms.push_back(dt);
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      const double flops = 4.0 * tokens * group * head_dim * static_cast<double>(context);
      nlohmann::json j{{"isa", isa},
                       {"head_dim", head_dim},
                       {"group", group},
                       {"tokens", tokens},
                       {"context", context},
                       {"ms_per_call", median},
                       {"gflops", flops / median / 1e6}};
      std::printf("%s\n", j.dump().c_str());
    }
  }
  tandem::kernels::ForceIsa("auto");
  return 0;
}
