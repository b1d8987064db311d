// Model hyper-parameters and tokenizer data read from GGUF metadata.
#pragma once

#include <string>

#include "common/status.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tandem::model {

// A Llama-family decoder. Dimensions in elements.
struct LlamaConfig {
  std::string architecture;  // general.architecture ("llama")
  std::string name;          // general.name (may be empty)
  int n_layers = 0;
  int dim = 0;      // embedding width
  int ffn_dim = 0;  // SwiGLU hidden width
  int n_heads = 0;
  int n_kv_heads = 0;  // grouped-query attention: n_heads % n_kv_heads == 0
  int head_dim = 0;    // dim / n_heads unless the file says otherwise
  int vocab_size = 0;
  int context_length = 0;  // trained context
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
  int rope_dim = 0;              // rotated dimensions per head (<= head_dim)
  bool tied_output = false;      // no output.weight: the embedding matrix is reused
  std::string chat_template;     // tokenizer.chat_template, may be empty

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads and validates the architecture keys; refuses architectures other than Llama's.
StatusOr<LlamaConfig> ReadLlamaConfig(const GgufFile& file);

// Copies tokenizer.* metadata out of the file.
StatusOr<VocabData> ReadVocab(const GgufFile& file);

}  // namespace tandem::model
