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
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "tiny-random");
  w.SetUint32("llama.block_count", s.n_layers);
  w.SetUint32("llama.embedding_length", s.dim);
  w.SetUint32("llama.feed_forward_length", s.ffn_dim);
  w.SetUint32("llama.attention.head_count", s.n_heads);
  w.SetUint32("llama.attention.head_count_kv", s.n_kv_heads);
  w.SetUint32("llama.context_length", s.context);
  w.SetUint32("llama.rope.dimension_count", s.dim / s.n_heads);
  w.SetFloat32("llama.rope.freq_base", 10000.0f);
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  std::mt19937 rng(s.seed);
  const int hd = s.dim / s.n_heads;
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
    add(p + "attn_q.weight", t, {s.dim, s.dim}, RandomMatrix(t, s.dim, s.dim, wscale, rng));
    add(p + "attn_k.weight", t, {s.dim, s.n_kv_heads * hd},
        RandomMatrix(t, s.n_kv_heads * hd, s.dim, wscale, rng));
    add(p + "attn_v.weight", t, {s.dim, s.n_kv_heads * hd},
        RandomMatrix(t, s.n_kv_heads * hd, s.dim, wscale, rng));
    add(p + "attn_output.weight", t, {s.dim, s.dim}, RandomMatrix(t, s.dim, s.dim, wscale, rng));
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
