#include "engine/transformer.h"

#include <cmath>

#include "common/fp16.h"
#include "engine/attention.h"
#include "kernels/activations.h"
#include "kernels/matmul.h"

namespace tandem::engine {
namespace {

// y = x / rms(x) * w over rows of n; the sum of squares is accumulated in double.
void RmsNorm(const float* x, const float* w, int64_t rows, int n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
    float* yr = y + r * n;
    for (int i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

}  // namespace

Transformer::Transformer(const model::LlamaConfig& config, const ModelWeights& weights,
                         ThreadPool* pool)
    : config_(config), weights_(weights), pool_(pool) {}

void Transformer::ParallelRows(int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool_ == nullptr || rows < 4) {
    fn(0, rows);
    return;
  }
  pool_->ParallelFor(rows, [&](int64_t b, int64_t e, int) { fn(b, e); });
}

void Transformer::EnsureScratch(int64_t t, int64_t logit_rows) {
  const auto& c = config_;
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  grow(x_, t * c.dim);
  grow(xn_, t * c.dim);
  grow(q_, t * c.q_dim());
  grow(k_, t * c.kv_dim());
  grow(v_, t * c.kv_dim());
  grow(attn_, t * c.q_dim());
  grow(gate_, t * c.ffn_dim);
  grow(up_, t * c.ffn_dim);
  grow(rope_cos_, t * (c.rope_dim / 2));
  grow(rope_sin_, t * (c.rope_dim / 2));
  grow(logit_in_, logit_rows * c.dim);
}

void Transformer::ComputeRope() {
  const int half = config_.rope_dim / 2;
  const float theta_scale = std::pow(config_.rope_freq_base, -2.0f / config_.rope_dim);
  for (size_t t = 0; t < token_pos_.size(); ++t) {
    float theta = static_cast<float>(token_pos_[t]) * config_.rope_freq_scale;
    for (int i = 0; i < half; ++i) {
      rope_cos_[t * half + i] = std::cos(theta);
      rope_sin_[t * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

// Llama ("normal") rotary embedding: rotates adjacent pairs (x[2i], x[2i+1]) of the first
// rope_dim dimensions of each head.
void Transformer::ApplyRope(float* x, int n_heads) {
  const int hd = config_.head_dim;
  const int half = config_.rope_dim / 2;
  for (size_t t = 0; t < token_pos_.size(); ++t) {
    const float* cs = &rope_cos_[t * half];
    const float* sn = &rope_sin_[t * half];
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cs[i] - b * sn[i];
        v[2 * i + 1] = a * sn[i] + b * cs[i];
      }
    }
  }
}

void Transformer::WriteKv(std::span<const BatchItem> batch, PagedKvCache& kv, int layer) {
  const int hd = config_.head_dim;
  const int bt = kv.shape().block_tokens;
  ParallelRows(static_cast<int64_t>(token_pos_.size()), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const BatchItem& item = batch[token_item_[t]];
      const int pos = token_pos_[t];
      const int32_t block = item.block_table[pos / bt];
      const int slot = pos % bt;
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        const float* ks = &k_[(t * config_.n_kv_heads + h) * hd];
        const float* vs = &v_[(t * config_.n_kv_heads + h) * hd];
        uint16_t* kd = kv.Keys(block, layer, h) + slot;  // (head_dim, block_tokens)
        uint16_t* vd = kv.Values(block, layer, h) + slot * hd;
        for (int d = 0; d < hd; ++d) {
          kd[d * bt] = Fp32ToFp16(ks[d]);
          vd[d] = Fp32ToFp16(vs[d]);
        }
      }
    }
  });
}

void Transformer::Attention(std::span<const BatchItem> batch, PagedKvCache& kv, int layer) {
  const int n_kv = config_.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  // Tasks: (item, tile of up to kMaxAttentionTile consecutive tokens, kv head).
  tiles_.clear();
  for (int64_t t = 0, i = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    const int n = static_cast<int>(batch[i].tokens.size());
    for (int s = 0; s < n; s += kMaxAttentionTile) {
      tiles_.push_back(
          {static_cast<int>(i), static_cast<int>(t + s), std::min(kMaxAttentionTile, n - s)});
    }
    t += n;
  }
  const int64_t tasks = static_cast<int64_t>(tiles_.size()) * n_kv;
  const int64_t qd = config_.q_dim();
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t task = begin; task < end; ++task) {
      const auto& tile = tiles_[task / n_kv];
      const int kv_head = static_cast<int>(task % n_kv);
      const BatchItem& item = batch[tile.item];
      AttentionArgs args{&kv, layer, item.block_table, config_.n_heads, scale};
      AttendTile(args, token_pos_[tile.first_token], tile.n, kv_head, &q_[tile.first_token * qd],
                 qd, &attn_[tile.first_token * qd], qd);
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(tasks, run);
  } else {
    run(0, tasks, 0);
  }
}

Status Transformer::Forward(std::span<const BatchItem> batch, PagedKvCache& kv,
                            std::vector<float>* logits) {
  const auto& c = config_;
  const int bt = kv.shape().block_tokens;
  token_pos_.clear();
  token_item_.clear();
  int64_t logit_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& item = batch[i];
    if (item.tokens.empty()) return InvalidArgument("batch item without tokens");
    const int64_t end = static_cast<int64_t>(item.start_pos) + item.tokens.size();
    if (item.start_pos < 0 || end > c.context_length) {
      return InvalidArgument("positions " + std::to_string(item.start_pos) + ".." +
                             std::to_string(end - 1) + " are outside the context length of " +
                             std::to_string(c.context_length));
    }
    if (static_cast<int64_t>(item.block_table.size()) * bt < end) {
      return InvalidArgument("block table of " + std::to_string(item.block_table.size()) +
                             " blocks cannot hold " + std::to_string(end) + " tokens");
    }
    for (int32_t tok : item.tokens) {
      if (tok < 0 || tok >= c.vocab_size) {
        return InvalidArgument("token id " + std::to_string(tok) + " outside the vocabulary");
      }
    }
    for (int32_t b : item.block_table) {
      if (b < 0 || b >= kv.num_blocks()) return InvalidArgument("block id out of range");
    }
    for (size_t j = 0; j < item.tokens.size(); ++j) {
      token_pos_.push_back(item.start_pos + static_cast<int>(j));
      token_item_.push_back(static_cast<int>(i));
    }
    logit_rows += item.want_logits ? 1 : 0;
  }
  const int64_t T = static_cast<int64_t>(token_pos_.size());
  EnsureScratch(T, logit_rows);
  ComputeRope();

  // Embedding lookup.
  for (int64_t t = 0, i = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    for (int32_t tok : batch[i].tokens) {
      const auto& e = weights_.token_embd;
      const auto* row = static_cast<const uint8_t*>(e.data) + tok * RowBytes(e.dtype, c.dim);
      kernels::DequantizeRow(e.dtype, row, &x_[t * c.dim], c.dim);
      ++t;
    }
  }

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights_.layers[l];
    ParallelRows(T, [&](int64_t b, int64_t e) {
      RmsNorm(&x_[b * c.dim], L.attn_norm.data(), e - b, c.dim, c.rms_eps, &xn_[b * c.dim]);
    });
    kernels::MatMul(L.wq, xn_.data(), T, q_.data(), pool_);
    kernels::MatMul(L.wk, xn_.data(), T, k_.data(), pool_);
    kernels::MatMul(L.wv, xn_.data(), T, v_.data(), pool_);
    ApplyRope(q_.data(), c.n_heads);
    ApplyRope(k_.data(), c.n_kv_heads);
    WriteKv(batch, kv, l);
    if (on_layer_done_) on_layer_done_(l);
    Attention(batch, kv, l);
    kernels::MatMul(L.wo, attn_.data(), T, xn_.data(), pool_);
    for (int64_t i = 0; i < T * c.dim; ++i) x_[i] += xn_[i];

    ParallelRows(T, [&](int64_t b, int64_t e) {
      RmsNorm(&x_[b * c.dim], L.ffn_norm.data(), e - b, c.dim, c.rms_eps, &xn_[b * c.dim]);
    });
    kernels::MatMul(L.w_gate, xn_.data(), T, gate_.data(), pool_);
    kernels::MatMul(L.w_up, xn_.data(), T, up_.data(), pool_);
    ParallelRows(T, [&](int64_t b, int64_t e) {
      kernels::SiluMul(&gate_[b * c.ffn_dim], &up_[b * c.ffn_dim], (e - b) * c.ffn_dim);
    });
    kernels::MatMul(L.w_down, gate_.data(), T, xn_.data(), pool_);
    for (int64_t i = 0; i < T * c.dim; ++i) x_[i] += xn_[i];
  }

  // Final norm and output head for the rows that want logits (the last token of each item).
  std::vector<float>& picked = logit_in_;
  picked.resize(logit_rows * c.dim);
  for (int64_t t = 0, i = 0, r = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    t += static_cast<int64_t>(batch[i].tokens.size());
    if (!batch[i].want_logits) continue;
    RmsNorm(&x_[(t - 1) * c.dim], weights_.output_norm.data(), 1, c.dim, c.rms_eps,
            &picked[r * c.dim]);
    ++r;
  }
  logits->resize(logit_rows * c.vocab_size);
  if (logit_rows > 0)
    kernels::MatMul(weights_.output, picked.data(), logit_rows, logits->data(), pool_);
  return OkStatus();
}

}  // namespace tandem::engine
