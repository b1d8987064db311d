// Tiny random-weight Llama models written as GGUF files, for tests (no tokenizer metadata).
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
};

// Writes the model to a fresh temporary file and returns its path (the caller removes it).
std::string WriteTinyLlama(const TinyLlamaSpec& spec);

}  // namespace tandem::engine::testing
