// The decoder forward pass (Llama and Gemma 3, see model::ModelConfig) over a mixed batch:
// sequences in prefill (a chunk of many tokens) and in decode (one token) run through every matrix
// multiply together.
//
//   Transformer tf(config, weights, &pool);
//   BatchItem items[] = {{blocks_a, 0, prompt_a, true}, {blocks_b, 17, {next_b}, true}};
//   TANDEM_RETURN_IF_ERROR(tf.Forward(items, kv, &logits));  // logits: (2, vocab)
//
// Thread-safety: one Forward at a time per Transformer (it owns scratch buffers); the thread
// pool parallelises inside a step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/batch_item.h"
#include "engine/kv_cache.h"
#include "engine/mock_forward.h"
#include "engine/model_weights.h"
#include "kernels/attention.h"
#include "model/model_config.h"

namespace tandem::engine {

class Transformer {
 public:
  // config, weights and pool must outlive the Transformer.
  Transformer(const model::ModelConfig& config, const ModelWeights& weights, ThreadPool* pool);

  // Appends the KV of every item's tokens to the cache (positions start_pos..start_pos+n-1)
  // and writes one row of vocab logits per item with want_logits (n rows with all_logits), in
  // item order, to *logits (resized to rows * vocab).
  Status Forward(std::span<const BatchItem> batch, PagedKvCache& kv, std::vector<float>* logits) {
    return ForwardLayers(batch, kv, 0, config_.n_layers, {}, nullptr, logits);
  }

  // One stage of a pipelined prefill: layers [begin_layer, end_layer) only, writing their KV.
  // The input is the tokens' embeddings when begin_layer == 0, else `hidden_in`: the residual
  // stream (T, dim) after layer begin_layer - 1, as an earlier stage's *hidden_out gave it (T =
  // tokens in the batch, item order). With end_layer == n_layers the output is the logits, as
  // Forward; otherwise *hidden_out gets the residual stream (T, dim) after end_layer - 1 and
  // *logits is left alone. Running the stages of a split in order over the same positions gives
  // bit for bit what Forward gives.
  Status ForwardLayers(std::span<const BatchItem> batch, PagedKvCache& kv, int begin_layer,
                       int end_layer, std::span<const float> hidden_in,
                       std::vector<float>* hidden_out, std::vector<float>* logits);

  // Called after each layer's KV has been written (layer index), e.g. to start moving it.
  void SetLayerDoneCallback(std::function<void(int layer)> fn) { on_layer_done_ = std::move(fn); }

  const model::ModelConfig& config() const { return config_; }

  // Positions per key range of attention (a multiple of kernels::kAttentionChunkAlign). A query
  // whose keys span several ranges gets them computed separately (on several threads when a step
  // has fewer attention tasks than threads, as a long decode does) and folded in position order.
  // The ranges fix the summation order, so outputs depend on this value and never on batching or
  // threads: every Transformer whose outputs are compared must use the same one.
  static constexpr int kDefaultAttentionChunk = 2048;
  Status SetAttentionChunk(int positions);

  // From now on every pass is `mock`'s: inputs are checked as before, then nothing is computed
  // (no KV written) and the time and logits are the mock's (engine/mock_forward.h).
  void SetMock(MockForward mock) { mock_.emplace(std::move(mock)); }
  bool mocked() const { return mock_.has_value(); }
  // MockForward::CreditHostSeconds; nothing without a mock.
  void CreditMockHostSeconds(double seconds) {
    if (mock_) mock_->CreditHostSeconds(seconds);
  }

 private:
  // Runs fn(begin, end) over row ranges on the pool.
  void ParallelRows(int64_t rows, const std::function<void(int64_t, int64_t)>& fn);
  void EnsureScratch(int64_t tokens, int64_t logit_rows);
  struct RopeTable {
    std::vector<float> cos, sin;  // (T, rope_dim / 2)
  };
  // Angles of every token of the step (token_pos_) for one RoPE base and scale.
  void ComputeRope(float freq_base, float freq_scale, RopeTable* table);
  void ApplyRope(const RopeTable& table, float* x, int n_heads);  // (T, n_heads, head_dim)
  // Per-head RMSNorm of x (T, n_heads, head_dim) with weight w (head_dim), in place.
  void HeadNorm(float* x, int n_heads, const std::vector<float>& w);
  // RMSNorm of the block output in xn_ (tokens, dim) with weight w, in place (Gemma).
  void PostNorm(const std::vector<float>& w, int64_t tokens);
  void RoundQueriesToFp16(int64_t n);  // the first n values of q_
  void WriteKv(std::span<const BatchItem> batch, PagedKvCache& kv, int layer);
  void Attention(std::span<const BatchItem> batch, PagedKvCache& kv, int layer);
  void Layer(std::span<const BatchItem> batch, PagedKvCache& kv, int layer);
  void Embed(std::span<const BatchItem> batch);
  // Final norm and output head over the rows that want logits.
  void Head(std::span<const BatchItem> batch, int64_t logit_rows, std::vector<float>* logits);

  const model::ModelConfig& config_;
  const ModelWeights& weights_;
  ThreadPool* pool_;
  std::function<void(int)> on_layer_done_;
  std::optional<MockForward> mock_;

  // Scratch, grown on demand. T = tokens in the batch.
  std::vector<float> x_;             // (T, dim) residual stream
  std::vector<float> xn_;            // (T, dim) normalised
  std::vector<float> q_;             // (T, q_dim)
  std::vector<float> k_;             // (T, kv_dim)
  std::vector<float> v_;             // (T, kv_dim)
  std::vector<float> attn_;          // (T, q_dim)
  std::vector<float> gate_;          // (T, ffn_dim)
  std::vector<float> up_;            // (T, ffn_dim)
  std::vector<float> logit_in_;      // (rows wanting logits, dim) normalised final states
  RopeTable rope_;                   // the global layers' (every layer without a window)
  RopeTable rope_swa_;               // the sliding layers' (their own base), when there are any
  std::vector<int32_t> token_pos_;   // (T) position of each token
  std::vector<int32_t> token_item_;  // (T) batch item of each token
  struct AttentionTile {
    int item;         // batch item
    int first_token;  // row of its first token in the step's (T, ...) matrices
    int n;            // tokens in the tile
    int first_range;  // key range of its first query's first key (position / chunk)
    int n_ranges;     // key ranges its queries see
  };
  std::vector<AttentionTile> tiles_;
  int attention_chunk_ = kDefaultAttentionChunk;
  // Partial results of the key ranges when they run in parallel (Attention).
  std::vector<float> range_acc_;
  std::vector<kernels::AttentionRowState> range_st_;
};

}  // namespace tandem::engine
