// Views of a model's weights inside a GgufFile, checked against the config's shapes.
// Matrices stay quantized: in the mapping, or (Q4_1 / Q8_0 on the AVX-512 path) in an
// interleaved copy of the same size that the decode kernels read faster (kernels/interleaved.h).
// Small vectors (norm weights) are copied to float32.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/interleaved.h"
#include "kernels/matmul.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace tandem::engine {

struct LayerWeights {
  std::vector<float> attn_norm;  // (dim)
  kernels::WeightView wq;        // (q_dim rows, dim cols)
  kernels::WeightView wk;        // (kv_dim, dim)
  kernels::WeightView wv;        // (kv_dim, dim)
  kernels::WeightView wo;        // (dim, q_dim)
  std::vector<float> ffn_norm;   // (dim)
  kernels::WeightView w_gate;    // (ffn_dim, dim)
  kernels::WeightView w_up;      // (ffn_dim, dim)
  kernels::WeightView w_down;    // (dim, ffn_dim)
  // Present when the config says so (Gemma 3), empty otherwise.
  std::vector<float> attn_q_norm;     // (head_dim) config.qk_norm
  std::vector<float> attn_k_norm;     // (head_dim) config.qk_norm
  std::vector<float> attn_post_norm;  // (dim) config.post_norms
  std::vector<float> ffn_post_norm;   // (dim) config.post_norms
};

struct ModelWeights {
  kernels::WeightView token_embd;  // (vocab, dim)
  std::vector<float> output_norm;  // (dim)
  kernels::WeightView output;      // (vocab, dim); the same view as token_embd when tied
  std::vector<LayerWeights> layers;
  // The interleaved copies the views above point into, where a matrix was interleaved.
  std::vector<kernels::InterleavedMatrix> interleaved;
};

// Finds every tensor the config needs; a missing tensor or a wrong shape is an error naming it.
// The returned views point into `file`, which must outlive them, or into `interleaved`.
StatusOr<ModelWeights> BindWeights(const model::GgufFile& file, const model::ModelConfig& config);

}  // namespace tandem::engine
