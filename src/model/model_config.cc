#include "model/model_config.h"

#include <cmath>

namespace tandem::model {
namespace {

StatusOr<int> ReadPositive(const GgufFile& f, const std::string& key, int64_t max) {
  TANDEM_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v == 0 || v > static_cast<uint64_t>(max)) {
    return InvalidArgument("metadata '" + key + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

// Gemma 3, as llama.cpp builds it (src/models/gemma3.cpp): embeddings scaled by sqrt(dim),
// per-head Q/K RMSNorm, post-attention and post-FFN norms, GeGLU (tanh GELU), NeoX RoPE, and
// sliding-window attention on every layer but each n-th of the sliding_window_pattern (6 by
// default) with its own RoPE base (10,000 by default).
Status ReadGemma3Keys(const GgufFile& f, ModelConfig* c) {
  const std::string p = c->architecture + ".";
  c->rope_neox = true;
  c->embedding_scale = std::sqrt(static_cast<float>(c->dim));
  c->ffn_activation = FfnActivation::kGeluTanh;
  c->qk_norm = true;
  c->post_norms = true;
  // Gemma's query scale is 1/sqrt(query_pre_attn_scalar): head_dim for every size but 27B
  // (62 layers), whose scalar is dim / n_heads.
  const float scalar =
      c->n_layers == 62 ? static_cast<float>(c->dim / c->n_heads) : static_cast<float>(c->head_dim);
  c->attention_scale = 1.0f / std::sqrt(scalar);
  if (f.Has(p + "final_logit_softcapping")) {
    TANDEM_ASSIGN_OR_RETURN(double cap, f.GetFloat(p + "final_logit_softcapping"));
    if (cap < 0) return InvalidArgument("final_logit_softcapping must not be negative");
    c->final_logit_softcap = static_cast<float>(cap);
  }
  if (!f.Has(p + "attention.sliding_window")) return OkStatus();
  TANDEM_ASSIGN_OR_RETURN(uint64_t window, f.GetUint(p + "attention.sliding_window"));
  if (window == 0) return OkStatus();
  if (window > static_cast<uint64_t>(c->context_length)) {
    return InvalidArgument("sliding window of " + std::to_string(window) +
                           " exceeds the context length");
  }
  c->sliding_window = static_cast<int>(window);
  if (f.Has(p + "rope.freq_base_swa")) {
    TANDEM_ASSIGN_OR_RETURN(double base, f.GetFloat(p + "rope.freq_base_swa"));
    c->rope_freq_base_swa = static_cast<float>(base);
  }
  c->sliding_layers.assign(c->n_layers, false);
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  const auto it = f.metadata().find(pattern_key);
  if (it != f.metadata().end() && std::holds_alternative<GgufArray>(it->second.value)) {
    const auto& items = std::get<GgufArray>(it->second.value).items;
    if (static_cast<int>(items.size()) != c->n_layers) {
      return InvalidArgument(pattern_key + " has " + std::to_string(items.size()) +
                             " entries for " + std::to_string(c->n_layers) + " layers");
    }
    for (int l = 0; l < c->n_layers; ++l) {
      const bool* b = std::get_if<bool>(&items[l].value);
      if (b == nullptr) return InvalidArgument(pattern_key + " is not an array of booleans");
      c->sliding_layers[l] = *b;
    }
    return OkStatus();
  }
  uint64_t period = 6;
  if (it != f.metadata().end()) {
    TANDEM_ASSIGN_OR_RETURN(period, f.GetUint(pattern_key));
  }
  // Period n: layers l with l % n < n - 1 slide, every n-th is global (n == 0: all slide).
  for (int l = 0; l < c->n_layers; ++l) {
    c->sliding_layers[l] = period == 0 || static_cast<uint64_t>(l) % period < period - 1;
  }
  return OkStatus();
}

}  // namespace

int ModelConfig::NumGlobalLayers() const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += IsSlidingLayer(l) ? 0 : 1;
  return n;
}

StatusOr<ModelConfig> ReadModelConfig(const GgufFile& f) {
  ModelConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  if (c.architecture == "llama") {
    c.arch = Architecture::kLlama;
  } else if (c.architecture == "gemma3") {
    c.arch = Architecture::kGemma3;
  } else {
    return Unimplemented("architecture '" + c.architecture + "' (tandem supports: llama, gemma3)");
  }
  if (f.Has("general.name")) {
    TANDEM_ASSIGN_OR_RETURN(c.name, f.GetString("general.name"));
  }
  const std::string p = c.architecture + ".";
  TANDEM_ASSIGN_OR_RETURN(c.n_layers, ReadPositive(f, p + "block_count", 1024));
  TANDEM_ASSIGN_OR_RETURN(c.dim, ReadPositive(f, p + "embedding_length", 1 << 16));
  TANDEM_ASSIGN_OR_RETURN(c.ffn_dim, ReadPositive(f, p + "feed_forward_length", 1 << 18));
  TANDEM_ASSIGN_OR_RETURN(c.n_heads, ReadPositive(f, p + "attention.head_count", 1024));
  c.n_kv_heads = c.n_heads;
  if (f.Has(p + "attention.head_count_kv")) {
    TANDEM_ASSIGN_OR_RETURN(c.n_kv_heads, ReadPositive(f, p + "attention.head_count_kv", 1024));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return InvalidArgument("head_count " + std::to_string(c.n_heads) +
                           " is not a multiple of head_count_kv " + std::to_string(c.n_kv_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  if (f.Has(p + "attention.key_length")) {
    TANDEM_ASSIGN_OR_RETURN(c.head_dim, ReadPositive(f, p + "attention.key_length", 1024));
  }
  if (c.head_dim % 2 != 0) return InvalidArgument("head dimension must be even");
  TANDEM_ASSIGN_OR_RETURN(c.context_length, ReadPositive(f, p + "context_length", 1 << 24));
  if (f.Has(p + "attention.layer_norm_rms_epsilon")) {
    TANDEM_ASSIGN_OR_RETURN(double eps, f.GetFloat(p + "attention.layer_norm_rms_epsilon"));
    c.rms_eps = static_cast<float>(eps);
  }
  if (f.Has(p + "rope.freq_base")) {
    TANDEM_ASSIGN_OR_RETURN(double base, f.GetFloat(p + "rope.freq_base"));
    c.rope_freq_base = static_cast<float>(base);
  }
  c.rope_dim = c.head_dim;
  if (f.Has(p + "rope.dimension_count")) {
    TANDEM_ASSIGN_OR_RETURN(c.rope_dim, ReadPositive(f, p + "rope.dimension_count", c.head_dim));
  }
  if (f.Has(p + "rope.scaling.type")) {
    TANDEM_ASSIGN_OR_RETURN(std::string type, f.GetString(p + "rope.scaling.type"));
    if (type == "linear") {
      TANDEM_ASSIGN_OR_RETURN(double factor, f.GetFloat(p + "rope.scaling.factor"));
      if (factor <= 0) return InvalidArgument("rope.scaling.factor must be positive");
      c.rope_freq_scale = static_cast<float>(1.0 / factor);
    } else if (type != "none") {
      return Unimplemented("rope scaling type '" + type + "' (supported: none, linear)");
    }
  }
  if (f.Has(p + "attention.value_length")) {
    TANDEM_ASSIGN_OR_RETURN(int value_length, ReadPositive(f, p + "attention.value_length", 1024));
    if (value_length != c.head_dim) {
      return Unimplemented("value heads of " + std::to_string(value_length) +
                           " elements differ from key heads of " + std::to_string(c.head_dim));
    }
  }
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.arch == Architecture::kGemma3) TANDEM_RETURN_IF_ERROR(ReadGemma3Keys(f, &c));
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return NotFound("tensor 'token_embd.weight' is missing");
  if (embd->dims.size() != 2 || embd->dims[0] != c.dim) {
    return InvalidArgument("token_embd.weight does not have " + std::to_string(c.dim) + " columns");
  }
  c.vocab_size = static_cast<int>(embd->dims[1]);
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  if (f.Has("tokenizer.chat_template")) {
    TANDEM_ASSIGN_OR_RETURN(c.chat_template, f.GetString("tokenizer.chat_template"));
  }
  return c;
}

StatusOr<VocabData> ReadVocab(const GgufFile& f) {
  VocabData v;
  TANDEM_ASSIGN_OR_RETURN(v.model, f.GetString("tokenizer.ggml.model"));
  if (f.Has("tokenizer.ggml.pre")) {
    TANDEM_ASSIGN_OR_RETURN(v.pre, f.GetString("tokenizer.ggml.pre"));
  }
  TANDEM_ASSIGN_OR_RETURN(v.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (f.Has("tokenizer.ggml.token_type")) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != v.tokens.size()) {
      return InvalidArgument("tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                             " entries for " + std::to_string(v.tokens.size()) + " tokens");
    }
    v.token_types.assign(types.begin(), types.end());
  } else {
    v.token_types.assign(v.tokens.size(), 1);
  }
  if (f.Has("tokenizer.ggml.merges")) {
    TANDEM_ASSIGN_OR_RETURN(v.merges, f.GetStringArray("tokenizer.ggml.merges"));
  }
  if (f.Has("tokenizer.ggml.scores")) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<double> scores, f.GetFloatArray("tokenizer.ggml.scores"));
    if (scores.size() != v.tokens.size()) {
      return InvalidArgument("tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                             " entries for " + std::to_string(v.tokens.size()) + " tokens");
    }
    v.scores.assign(scores.begin(), scores.end());
  }
  if (f.Has("tokenizer.ggml.add_space_prefix")) {
    TANDEM_ASSIGN_OR_RETURN(v.add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  }
  auto read_id = [&](const std::string& key, int32_t* out) -> Status {
    if (!f.Has(key)) return OkStatus();
    TANDEM_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (id >= v.tokens.size()) {
      return InvalidArgument("metadata '" + key + "' = " + std::to_string(id) +
                             " is not a token id (vocabulary of " +
                             std::to_string(v.tokens.size()) + ")");
    }
    *out = static_cast<int32_t>(id);
    return OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(read_id("tokenizer.ggml.bos_token_id", &v.bos_id));
  TANDEM_RETURN_IF_ERROR(read_id("tokenizer.ggml.eos_token_id", &v.eos_id));
  TANDEM_RETURN_IF_ERROR(read_id("tokenizer.ggml.unknown_token_id", &v.unk_id));
  TANDEM_RETURN_IF_ERROR(read_id("tokenizer.ggml.padding_token_id", &v.pad_id));
  if (f.Has("tokenizer.ggml.add_bos_token")) {
    TANDEM_ASSIGN_OR_RETURN(v.add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (f.Has("tokenizer.ggml.add_eos_token")) {
    TANDEM_ASSIGN_OR_RETURN(v.add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  }
  return v;
}

}  // namespace tandem::model
