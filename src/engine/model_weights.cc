#include "engine/model_weights.h"

#include <string>

namespace tandem::engine {
namespace {

using model::GgufFile;
using model::GgufTensor;

StatusOr<const GgufTensor*> Find(const GgufFile& f, const std::string& name,
                                 std::vector<int64_t> dims) {
  const GgufTensor* t = f.FindTensor(name);
  if (t == nullptr) return NotFound("tensor '" + name + "' is missing");
  if (t->dims != dims) {
    std::string want, got;
    for (auto d : dims) want += (want.empty() ? "" : "x") + std::to_string(d);
    for (auto d : t->dims) got += (got.empty() ? "" : "x") + std::to_string(d);
    return InvalidArgument("tensor '" + name + "' has shape " + got + ", expected " + want);
  }
  return t;
}

// rows x cols matrix (GGUF dims {cols, rows}).
StatusOr<kernels::WeightView> Matrix(const GgufFile& f, const std::string& name, int64_t rows,
                                     int64_t cols) {
  TANDEM_ASSIGN_OR_RETURN(const GgufTensor* t, Find(f, name, {cols, rows}));
  return kernels::WeightView{t->dtype, rows, cols, t->data};
}

StatusOr<std::vector<float>> Vector(const GgufFile& f, const std::string& name, int64_t n) {
  TANDEM_ASSIGN_OR_RETURN(const GgufTensor* t, Find(f, name, {n}));
  std::vector<float> out(n);
  kernels::DequantizeRow(t->dtype, t->data, out.data(), n);
  return out;
}

}  // namespace

StatusOr<ModelWeights> BindWeights(const GgufFile& f, const model::ModelConfig& c) {
  ModelWeights w;
  TANDEM_ASSIGN_OR_RETURN(w.token_embd, Matrix(f, "token_embd.weight", c.vocab_size, c.dim));
  TANDEM_ASSIGN_OR_RETURN(w.output_norm, Vector(f, "output_norm.weight", c.dim));
  if (c.tied_output) {
    w.output = w.token_embd;
  } else {
    TANDEM_ASSIGN_OR_RETURN(w.output, Matrix(f, "output.weight", c.vocab_size, c.dim));
  }
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    TANDEM_ASSIGN_OR_RETURN(L.attn_norm, Vector(f, p + "attn_norm.weight", c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.wq, Matrix(f, p + "attn_q.weight", c.q_dim(), c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.wk, Matrix(f, p + "attn_k.weight", c.kv_dim(), c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.wv, Matrix(f, p + "attn_v.weight", c.kv_dim(), c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.wo, Matrix(f, p + "attn_output.weight", c.dim, c.q_dim()));
    TANDEM_ASSIGN_OR_RETURN(L.ffn_norm, Vector(f, p + "ffn_norm.weight", c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.w_gate, Matrix(f, p + "ffn_gate.weight", c.ffn_dim, c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.w_up, Matrix(f, p + "ffn_up.weight", c.ffn_dim, c.dim));
    TANDEM_ASSIGN_OR_RETURN(L.w_down, Matrix(f, p + "ffn_down.weight", c.dim, c.ffn_dim));
    if (c.qk_norm) {
      TANDEM_ASSIGN_OR_RETURN(L.attn_q_norm, Vector(f, p + "attn_q_norm.weight", c.head_dim));
      TANDEM_ASSIGN_OR_RETURN(L.attn_k_norm, Vector(f, p + "attn_k_norm.weight", c.head_dim));
    }
    if (c.post_norms) {
      TANDEM_ASSIGN_OR_RETURN(L.attn_post_norm, Vector(f, p + "post_attention_norm.weight", c.dim));
      TANDEM_ASSIGN_OR_RETURN(L.ffn_post_norm, Vector(f, p + "post_ffw_norm.weight", c.dim));
    }
  }
  // Interleave what the matmul kernels read faster that way. The copy replaces the mapping's
  // pages (released behind it as it goes), so weights stay within the file's size in memory; a
  // tied embedding is looked up in the copy too.
  std::vector<kernels::WeightView*> matrices = {&w.output};
  for (LayerWeights& L : w.layers) {
    for (kernels::WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      matrices.push_back(v);
    }
  }
  for (kernels::WeightView* v : matrices) {
    if (!kernels::ShouldInterleave(*v)) continue;
    const auto* source = static_cast<const uint8_t*>(v->data);
    w.interleaved.emplace_back(*v, [&f, source](size_t bytes) { f.ReleasePages(source, bytes); });
    *v = w.interleaved.back().view();
  }
  if (c.tied_output) w.token_embd = w.output;
  return w;
}

}  // namespace tandem::engine
