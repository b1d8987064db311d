// One engine instance: a loaded model (mmapped weights, tokenizer, chat template), its paged KV
// cache and thread pool, and a simple generation loop for one sequence at a time.
//
//   TANDEM_ASSIGN_OR_RETURN(auto engine, Engine::Load({.model_path = "m.gguf", .threads = 2}));
//   auto ids = engine->tokenizer().Encode("Once upon", engine->tokenizer().add_bos(), false);
//   TANDEM_ASSIGN_OR_RETURN(auto result, engine->Generate(ids, {.max_tokens = 32}, nullptr));
//
// Thread-safety: not thread-safe; one caller drives the engine (the serving loop).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/model_weights.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/text_front_end.h"
#include "model/tokenizer.h"

namespace tandem::engine {

struct EngineOptions {
  std::string model_path;
  int threads = 1;
  // Threads the engine may be resized to at runtime (Engine::SetThreads); the pool starts
  // them all and parks those beyond `threads`. 0: `threads`.
  int max_threads = 0;
  int block_tokens = 16;
  int kv_capacity_tokens = 0;  // 0: the model's context length
  int prefill_chunk = 512;     // tokens per forward step while prefilling
  // Sliding-window models (Gemma 3): the most sequences, and the most tokens per forward step,
  // that the caller runs at once. They size the window arena that holds the sliding layers'
  // KV (KvCacheShape::WindowBlocksFor); 0 sequences: room for every block (no saving).
  int max_sequences = 0;
  int max_step_tokens = 0;  // 0: prefill_chunk
  // Where the KV cache lives: null for the heap; otherwise called once with the bytes needed
  // and returns 64-byte aligned memory that outlives the engine (e.g. a transfer-engine
  // segment, so that peers can read and write KV blocks in place).
  std::function<StatusOr<uint8_t*>(size_t bytes)> kv_memory;
  // A mock engine (engine/mock_forward.h) when set: every forward pass takes this many seconds
  // and computes nothing; the KV cache keeps the model's layers and blocks but one K and one V
  // value per token and layer (what moves between mock workers is bookkeeping, not data); every
  // sequence generates the same ordinary token (never an end of generation).
  std::function<double(std::span<const BatchItem> batch)> mock_step_seconds;
  // A Jinja chat template used instead of the file's tokenizer.chat_template; empty: the file's.
  std::string chat_template;
};

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens (including a final end-of-generation token)
  std::string finish_reason;    // "stop" (end-of-generation token) or "length"
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::vector<float> first_logits;  // (vocab) logits after the prompt
};

// The KV cache shape for `config` with room for capacity_tokens positions, laid out per `options`
// (block size; window arena from max_sequences and max_step_tokens).
KvCacheShape KvShapeFor(const model::ModelConfig& config, const EngineOptions& options,
                        int64_t capacity_tokens);

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Load(const EngineOptions& options);

  const model::ModelConfig& config() const { return config_; }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null when the model has no chat template tandem recognises; chat_template_error() says why.
  const model::ChatTemplate* chat_template() const {
    return chat_template_ ? &*chat_template_ : nullptr;
  }
  const std::string& chat_template_error() const { return chat_template_error_; }
  Transformer& transformer() { return *transformer_; }
  PagedKvCache& kv() { return *kv_; }
  ThreadPool& pool() { return *pool_; }
  // The options it was loaded with, but `threads` is the count it computes on now.
  const EngineOptions& options() const { return options_; }
  int threads() const { return options_.threads; }
  int max_threads() const { return pool_->max_threads(); }
  // Computes on `threads` threads from the next forward pass on (elastic pools give a worker
  // more cores, or take some back). InvalidArgument outside [1, max_threads()]. Results do not
  // depend on the count (the kernels are thread-count invariant), so a running sequence
  // continues bit for bit as it would have.
  Status SetThreads(int threads);
  size_t model_bytes() const { return gguf_->file_size(); }

  // Prefills `prompt` in chunks, then samples up to max_tokens. on_token (may be null) sees each
  // token as it is produced and may return false to stop early. KV blocks are returned to the
  // pool before returning.
  StatusOr<GenerateResult> Generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                    const std::function<bool(int32_t)>& on_token);

 private:
  Engine() = default;
  // One forward step of one sequence, with its sliding-window KV storage attached before and
  // trimmed after.
  Status Step(const BatchItem& item, std::vector<float>* logits);
  int32_t MockToken() const;  // what a mock engine generates

  EngineOptions options_;
  std::unique_ptr<model::GgufFile> gguf_;
  model::ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> chat_template_;
  std::string chat_template_error_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<Transformer> transformer_;
};

}  // namespace tandem::engine
