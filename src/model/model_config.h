// Model hyper-parameters and tokenizer data read from GGUF metadata.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tandem::model {

enum class Architecture { kLlama, kGemma3 };
enum class FfnActivation {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU with the tanh approximation of GELU: gelu(gate) * up
};

// A decoder-only transformer of the families tandem runs: Llama (SmolLM2) and Gemma 3.
// Dimensions in elements. The fields after `chat_template` are the Gemma 3 differences; their
// defaults are Llama's.
struct ModelConfig {
  std::string architecture;  // general.architecture ("llama", "gemma3")
  Architecture arch = Architecture::kLlama;
  std::string name;  // general.name (may be empty)
  int n_layers = 0;
  int dim = 0;      // embedding width
  int ffn_dim = 0;  // gated FFN hidden width
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

  // RoPE pairs: false rotates adjacent (x[2i], x[2i+1]) (Llama); true rotates
  // (x[i], x[i + rope_dim/2]) (GPT-NeoX style, Gemma).
  bool rope_neox = false;
  float embedding_scale = 1.0f;  // token embeddings are multiplied by it (Gemma: sqrt(dim))
  FfnActivation ffn_activation = FfnActivation::kSilu;
  bool qk_norm = false;       // RMSNorm of every Q and K head before RoPE (attn_q/k_norm.weight)
  bool post_norms = false;    // RMSNorm of the attention and FFN outputs before each residual add
  float attention_scale = 0;  // multiplies q.k before the softmax (1/sqrt(head_dim) by default)
  // Sliding-window attention: a query at position p of a sliding layer sees keys at positions
  // [p - sliding_window + 1, p]. sliding_layers[l] says whether layer l slides (empty: none).
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  float rope_freq_base_swa = 10000.0f;  // RoPE of the sliding layers
  float rope_freq_scale_swa = 1.0f;
  float final_logit_softcap = 0;  // > 0: logits = cap * tanh(logits / cap)

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  bool IsSlidingLayer(int layer) const { return !sliding_layers.empty() && sliding_layers[layer]; }
  // Layers with full (global) attention: their KV grows with the context.
  int NumGlobalLayers() const;
};

// Reads and validates the architecture keys ("llama" or "gemma3"); refuses other architectures.
StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file);

// Copies tokenizer.* metadata out of the file.
StatusOr<VocabData> ReadVocab(const GgufFile& file);

}  // namespace tandem::model
