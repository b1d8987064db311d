#include "model/model_config.h"

namespace tandem::model {
namespace {

StatusOr<int> ReadPositive(const GgufFile& f, const std::string& key, int64_t max) {
  TANDEM_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v == 0 || v > static_cast<uint64_t>(max)) {
    return InvalidArgument("metadata '" + key + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

}  // namespace

StatusOr<LlamaConfig> ReadLlamaConfig(const GgufFile& f) {
  LlamaConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return Unimplemented("architecture '" + c.architecture + "' (tandem supports: llama)");
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
    TANDEM_ASSIGN_OR_RETURN(std::vector<double> scores,
                            f.GetFloatArray("tokenizer.ggml.scores"));
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
