#include "engine/test_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/check.h"
#include "kernels/matmul.h"
#include "model/gguf_writer.h"

namespace tandem::engine::testing {
namespace {

std::vector<uint8_t> RandomMatrix(DType dtype, int64_t rows, int64_t cols, float scale,
                                  std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> row(cols);
  const int64_t row_bytes = RowBytes(dtype, cols);
  std::vector<uint8_t> out(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = normal(rng);
    kernels::QuantizeRow(dtype, row.data(), out.data() + r * row_bytes, cols);
  }
  return out;
}

std::vector<uint8_t> NormWeights(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.8f, 1.2f);
  std::vector<uint8_t> out(n * 4);
  for (int i = 0; i < n; ++i) {
    const float v = u(rng);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

}  // namespace

std::string WriteTinyLlama(const TinyLlamaSpec& s) {
  using model::GgufWriter;
  GgufWriter w;
  const std::string arch = s.gemma3 ? "gemma3" : "llama";
  const int hd = s.head_dim > 0 ? s.head_dim : s.dim / s.n_heads;
  w.SetString("general.architecture", arch);
  w.SetString("general.name", "tiny-random");
  w.SetUint32(arch + ".block_count", s.n_layers);
  w.SetUint32(arch + ".embedding_length", s.dim);
  w.SetUint32(arch + ".feed_forward_length", s.ffn_dim);
  w.SetUint32(arch + ".attention.head_count", s.n_heads);
  w.SetUint32(arch + ".attention.head_count_kv", s.n_kv_heads);
  w.SetUint32(arch + ".attention.key_length", hd);
  w.SetUint32(arch + ".attention.value_length", hd);
  w.SetUint32(arch + ".context_length", s.context);
  w.SetUint32(arch + ".rope.dimension_count", hd);
  w.SetFloat32(arch + ".rope.freq_base", s.gemma3 ? 1e6f : 10000.0f);
  w.SetFloat32(arch + ".attention.layer_norm_rms_epsilon", s.gemma3 ? 1e-6f : 1e-5f);
  if (s.gemma3) {
    w.SetUint32(arch + ".attention.sliding_window", s.sliding_window);
    w.SetUint32(arch + ".attention.sliding_window_pattern", s.swa_pattern);
  }
  std::mt19937 rng(s.seed);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  auto add = [&](const std::string& name, DType t, std::vector<int64_t> dims,
                 std::vector<uint8_t> bytes) {
    TANDEM_CHECK_OK(w.AddTensor(name, t, dims, std::move(bytes)));
  };
  add("token_embd.weight", s.embd_dtype, {s.dim, s.vocab},
      RandomMatrix(s.embd_dtype, s.vocab, s.dim, 1.0f, rng));
  add("output_norm.weight", DType::kF32, {s.dim}, NormWeights(s.dim, rng));
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto t = s.matrix_dtype;
    add(p + "attn_norm.weight", DType::kF32, {s.dim}, NormWeights(s.dim, rng));
    add(p + "attn_q.weight", t, {s.dim, s.n_heads * hd},
        RandomMatrix(t, s.n_heads * hd, s.dim, wscale, rng));
    add(p + "attn_k.weight", t, {s.dim, s.n_kv_heads * hd},
        RandomMatrix(t, s.n_kv_heads * hd, s.dim, wscale, rng));
    add(p + "attn_v.weight", t, {s.dim, s.n_kv_heads * hd},
        RandomMatrix(t, s.n_kv_heads * hd, s.dim, wscale, rng));
    add(p + "attn_output.weight", t, {s.n_heads * hd, s.dim},
        RandomMatrix(t, s.dim, s.n_heads * hd, wscale, rng));
    if (s.gemma3) {
      add(p + "attn_q_norm.weight", DType::kF32, {hd}, NormWeights(hd, rng));
      add(p + "attn_k_norm.weight", DType::kF32, {hd}, NormWeights(hd, rng));
      add(p + "post_attention_norm.weight", DType::kF32, {s.dim}, NormWeights(s.dim, rng));
      add(p + "post_ffw_norm.weight", DType::kF32, {s.dim}, NormWeights(s.dim, rng));
    }
    add(p + "ffn_norm.weight", DType::kF32, {s.dim}, NormWeights(s.dim, rng));
    add(p + "ffn_gate.weight", t, {s.dim, s.ffn_dim},
        RandomMatrix(t, s.ffn_dim, s.dim, wscale, rng));
    add(p + "ffn_up.weight", t, {s.dim, s.ffn_dim}, RandomMatrix(t, s.ffn_dim, s.dim, wscale, rng));
    add(p + "ffn_down.weight", t, {s.ffn_dim, s.dim},
        RandomMatrix(t, s.dim, s.ffn_dim, 1.0f / std::sqrt(static_cast<float>(s.ffn_dim)), rng));
  }
  char path[] = "/tmp/tandem_tiny_XXXXXX";
  const int fd = mkstemp(path);
  TANDEM_CHECK(fd >= 0) << "mkstemp " << path;
  close(fd);
  TANDEM_CHECK_OK(w.WriteFile(path));
  return path;
}

}  // namespace tandem::engine::testing
