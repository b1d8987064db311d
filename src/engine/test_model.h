// Tiny random-weight models (Llama, or Gemma 3 with `gemma3`) written as GGUF files, for tests
// (no tokenizer metadata).
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace tandem::engine::testing {

struct TinyLlamaSpec {
  int n_layers = 2;
  int dim = 64;
  int ffn_dim = 128;
  int n_heads = 4;
  int n_kv_heads = 2;
  int vocab = 96;
  int context = 512;
  DType matrix_dtype = DType::kQ4_1;  // attention and FFN matrices
  DType embd_dtype = DType::kQ8_0;    // embedding (tied output)
  uint32_t seed = 1;
  // Gemma 3 instead of Llama: Q/K norms, post-attention and post-FFN norms, GeGLU, NeoX RoPE,
  // and sliding-window attention (every swa_pattern-th layer global, the others sliding over
  // sliding_window positions with RoPE base 10,000; the global base is 1,000,000).
  bool gemma3 = false;
  int head_dim = 0;  // 0: dim / n_heads (Gemma 3 sets its own)
  int sliding_window = 8;
  int swa_pattern = 3;
};

// Writes the model to a fresh temporary file and returns its path (the caller removes it).
std::string WriteTinyLlama(const TinyLlamaSpec& spec);

}  // namespace tandem::engine::testing
