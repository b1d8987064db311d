#include "engine/engine.h"

#include <algorithm>
#include <chrono>

namespace tandem::engine {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Load(const EngineOptions& options) {
  if (options.threads < 1 || options.threads > 256) {
    return InvalidArgument("threads must be in [1, 256], got " + std::to_string(options.threads));
  }
  if (options.max_threads != 0 &&
      (options.max_threads < options.threads || options.max_threads > 256)) {
    return InvalidArgument("max threads must be in [threads, 256], got " +
                           std::to_string(options.max_threads));
  }
  if (options.prefill_chunk < 1) return InvalidArgument("prefill chunk must be positive");
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  TANDEM_ASSIGN_OR_RETURN(e->gguf_, model::GgufFile::Open(options.model_path));
  TANDEM_ASSIGN_OR_RETURN(e->config_, model::ReadModelConfig(*e->gguf_));
  TANDEM_ASSIGN_OR_RETURN(e->weights_, BindWeights(*e->gguf_, e->config_));
  if (!options.chat_template.empty()) e->config_.chat_template = options.chat_template;
  TANDEM_ASSIGN_OR_RETURN(model::TextFrontEnd text, model::LoadTextFrontEnd(*e->gguf_, e->config_));
  e->tokenizer_ = std::move(text.tokenizer);
  e->chat_template_ = std::move(text.chat_template);
  e->chat_template_error_ = std::move(text.chat_template_error);
  const auto& c = e->config_;
  if (c.n_heads / c.n_kv_heads > 16 || c.head_dim > 256) {
    return Unimplemented("attention shape (group of " + std::to_string(c.n_heads / c.n_kv_heads) +
                         ", head dim " + std::to_string(c.head_dim) + ") exceeds kernel limits");
  }
  if (options.block_tokens < 1 || options.block_tokens > 256) {
    return InvalidArgument("block tokens must be in [1, 256]");
  }
  const int capacity =
      options.kv_capacity_tokens > 0 ? options.kv_capacity_tokens : c.context_length;
  // A mock engine stands for a model of any context: its KV capacity bounds it.
  if (options.mock_step_seconds) e->config_.context_length = std::max(c.context_length, capacity);
  KvCacheShape shape = KvShapeFor(c, options, capacity);
  if (options.mock_step_seconds) {
    shape.n_kv_heads = 1;
    shape.head_dim = 1;
  }
  if (options.kv_memory) {
    const size_t bytes = PagedKvCache::RequiredBytes(shape);
    TANDEM_ASSIGN_OR_RETURN(uint8_t * memory, options.kv_memory(bytes));
    TANDEM_ASSIGN_OR_RETURN(e->kv_, PagedKvCache::CreateOn(shape, memory, bytes));
  } else {
    TANDEM_ASSIGN_OR_RETURN(e->kv_, PagedKvCache::Create(shape));
  }
  e->pool_ =
      std::make_unique<ThreadPool>(options.threads, std::max(options.threads, options.max_threads));
  e->transformer_ = std::make_unique<Transformer>(e->config_, e->weights_, e->pool_.get());
  if (options.mock_step_seconds) {
    e->transformer_->SetMock(
        MockForward({.step_seconds = options.mock_step_seconds, .token = e->MockToken()}));
  }
  return e;
}

KvCacheShape KvShapeFor(const model::ModelConfig& c, const EngineOptions& options,
                        int64_t capacity_tokens) {
  KvCacheShape shape;
  shape.n_layers = c.n_layers;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.block_tokens = options.block_tokens;
  shape.num_blocks =
      static_cast<int>((capacity_tokens + options.block_tokens - 1) / options.block_tokens);
  if (c.sliding_window > 0 && c.NumGlobalLayers() < c.n_layers) {
    shape.sliding = c.sliding_layers;
    shape.window_tokens = c.sliding_window;
    const int step = options.max_step_tokens > 0 ? options.max_step_tokens : options.prefill_chunk;
    // Never more than one window block per block: beyond that the arena could not be used.
    shape.num_window_blocks =
        options.max_sequences > 0
            ? std::min(shape.num_blocks, shape.WindowBlocksFor(options.max_sequences, step))
            : shape.num_blocks;
  }
  return shape;
}

int32_t Engine::MockToken() const {
  // " the": an ordinary word in every vocabulary tandem loads; else the first id that is not an
  // end of generation.
  const std::vector<int32_t> ids = tokenizer_->Encode(" the", false, false);
  if (!ids.empty() && !tokenizer_->IsEndOfGeneration(ids.front())) return ids.front();
  int32_t id = 0;
  while (id + 1 < config_.vocab_size && tokenizer_->IsEndOfGeneration(id)) ++id;
  return id;
}

Status Engine::SetThreads(int threads) {
  if (threads < 1 || threads > pool_->max_threads()) {
    return InvalidArgument("threads must be in [1, " + std::to_string(pool_->max_threads()) +
                           "] (the engine's --max-threads), got " + std::to_string(threads));
  }
  options_.threads = pool_->SetActiveThreads(threads);
  return OkStatus();
}

Status Engine::Step(const BatchItem& item, std::vector<float>* logits) {
  const int64_t end = item.start_pos + static_cast<int64_t>(item.tokens.size());
  TANDEM_RETURN_IF_ERROR(kv_->AttachWindow(item.block_table, item.start_pos, end));
  TANDEM_RETURN_IF_ERROR(transformer_->Forward({&item, 1}, *kv_, logits));
  kv_->TrimWindow(item.block_table, end);
  return OkStatus();
}

StatusOr<GenerateResult> Engine::Generate(std::span<const int32_t> prompt,
                                          const GenerateOptions& options,
                                          const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) return InvalidArgument("the prompt has no tokens");
  if (options.max_tokens < 0) return InvalidArgument("max_tokens must be >= 0");
  TANDEM_RETURN_IF_ERROR(options.sampling.Validate());
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (total > config_.context_length) {
    return OutOfRange("prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                      std::to_string(options.max_tokens) + ") exceeds the context length of " +
                      std::to_string(config_.context_length));
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> blocks, kv_->Allocate(kv_->BlocksFor(total)));
  struct BlockGuard {
    PagedKvCache* kv;
    std::vector<int32_t>* blocks;
    ~BlockGuard() { kv->Release(*blocks); }
  } guard{kv_.get(), &blocks};

  GenerateResult result;
  const std::vector<int32_t> end_tokens = tokenizer_->EndOfGenerationIds();
  Sampler sampler(options.sampling, prompt, end_tokens);
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t start = 0; start < prompt.size(); start += options_.prefill_chunk) {
    const size_t n = std::min<size_t>(options_.prefill_chunk, prompt.size() - start);
    BatchItem item{blocks, static_cast<int>(start), prompt.subspan(start, n),
                   start + n == prompt.size()};
    TANDEM_RETURN_IF_ERROR(Step(item, &logits));
  }
  result.prefill_seconds = Seconds(t0);
  result.first_logits = logits;
  result.finish_reason = "length";
  const auto t1 = std::chrono::steady_clock::now();
  int pos = static_cast<int>(prompt.size());
  for (int i = 0; i < options.max_tokens; ++i) {
    const int32_t tok = sampler.Sample(logits).token;
    result.tokens.push_back(tok);
    if (on_token && !on_token(tok)) break;
    const auto& stop_ids = options.sampling.stop_token_ids;
    if ((!options.ignore_eos && tokenizer_->IsEndOfGeneration(tok)) ||
        std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (i + 1 == options.max_tokens) break;
    BatchItem item{blocks, pos, {&result.tokens.back(), 1}, true};
    TANDEM_RETURN_IF_ERROR(Step(item, &logits));
    ++pos;
  }
  result.decode_seconds = Seconds(t1);
  return result;
}

}  // namespace tandem::engine
