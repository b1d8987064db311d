#include "engine/transformer.h"

#include <algorithm>
#include <cmath>

#include "common/fp16.h"
#include "engine/attention.h"
#include "kernels/activations.h"
#include "kernels/matmul.h"

namespace tandem::engine {
namespace {

// y = x / rms(x) * w over rows of n; the sum of squares is accumulated in double, in four
// interleaved partial sums (independent add chains; the order is fixed, so results are too).
void RmsNorm(const float* x, const float* w, int64_t rows, int n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double part[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int j = 0; j < 4; ++j) part[j] += static_cast<double>(xr[i + j] * xr[i + j]);
    }
    for (; i < n; ++i) part[0] += static_cast<double>(xr[i] * xr[i]);
    const double sum = (part[0] + part[1]) + (part[2] + part[3]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
    float* yr = y + r * n;
    for (int i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

}  // namespace

Transformer::Transformer(const model::ModelConfig& config, const ModelWeights& weights,
                         ThreadPool* pool)
    : config_(config), weights_(weights), pool_(pool) {}

Status Transformer::SetAttentionChunk(int positions) {
  if (positions <= 0 || positions % kernels::kAttentionChunkAlign != 0) {
    return InvalidArgument("attention chunk of " + std::to_string(positions) +
                           " positions: must be a positive multiple of " +
                           std::to_string(kernels::kAttentionChunkAlign));
  }
  attention_chunk_ = positions;
  return OkStatus();
}

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
  for (RopeTable* r : {&rope_, &rope_swa_}) {
    grow(r->cos, t * (c.rope_dim / 2));
    grow(r->sin, t * (c.rope_dim / 2));
  }
  grow(logit_in_, logit_rows * c.dim);
}

void Transformer::ComputeRope(float freq_base, float freq_scale, RopeTable* table) {
  const int half = config_.rope_dim / 2;
  const float theta_scale = std::pow(freq_base, -2.0f / config_.rope_dim);
  for (size_t t = 0; t < token_pos_.size(); ++t) {
    float theta = static_cast<float>(token_pos_[t]) * freq_scale;
    for (int i = 0; i < half; ++i) {
      table->cos[t * half + i] = std::cos(theta);
      table->sin[t * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

// Rotates pair i of the first rope_dim dimensions of each head by angle i: the pair is
// (x[2i], x[2i+1]) for Llama, (x[i], x[i + rope_dim/2]) for NeoX-style models (Gemma).
void Transformer::ApplyRope(const RopeTable& table, float* x, int n_heads) {
  const int hd = config_.head_dim;
  const int half = config_.rope_dim / 2;
  const int stride = config_.rope_neox ? 1 : 2;     // distance between a pair's first elements
  const int offset = config_.rope_neox ? half : 1;  // from a pair's first to its second
  for (size_t t = 0; t < token_pos_.size(); ++t) {
    const float* cs = &table.cos[t * half];
    const float* sn = &table.sin[t * half];
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        float* p = v + i * stride;
        const float a = p[0], b = p[offset];
        p[0] = a * cs[i] - b * sn[i];
        p[offset] = a * sn[i] + b * cs[i];
      }
    }
  }
}

void Transformer::HeadNorm(float* x, int n_heads, const std::vector<float>& w) {
  const int hd = config_.head_dim;
  ParallelRows(static_cast<int64_t>(token_pos_.size()) * n_heads, [&](int64_t b, int64_t e) {
    RmsNorm(x + b * hd, w.data(), e - b, hd, config_.rms_eps, x + b * hd);
  });
}

void Transformer::PostNorm(const std::vector<float>& w, int64_t tokens) {
  ParallelRows(tokens, [&](int64_t b, int64_t e) {
    RmsNorm(&xn_[b * config_.dim], w.data(), e - b, config_.dim, config_.rms_eps,
            &xn_[b * config_.dim]);
  });
}

// llama.cpp multiplies queries with the fp16 key cache through an fp16 dot product, so its
// queries are rounded to fp16 first; doing the same keeps the two engines' scores within float
// summation noise of each other (the rounding error, 2^-11 relative, is below what the fp16
// keys already carry).
void Transformer::RoundQueriesToFp16(int64_t n) {
  constexpr int64_t kChunk = 4096;  // values per parallel task
  ParallelRows((n + kChunk - 1) / kChunk, [&](int64_t b, int64_t e) {
    kernels::RoundToFp16(&q_[b * kChunk], std::min(n, e * kChunk) - b * kChunk);
  });
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
  const int group = config_.n_heads / n_kv, hd = config_.head_dim;
  const float scale = config_.attention_scale;
  const int window = config_.IsSlidingLayer(layer) ? config_.sliding_window : 0;
  const int chunk = attention_chunk_;
  // Tiles of up to kMaxAttentionTile consecutive tokens of one item, and the key ranges
  // [chunk * r, chunk * (r + 1)) their queries see.
  tiles_.clear();
  for (int64_t t = 0, i = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    const int n = static_cast<int>(batch[i].tokens.size());
    for (int s = 0; s < n; s += kMaxAttentionTile) {
      AttentionTile tile{static_cast<int>(i), static_cast<int>(t + s),
                         std::min(kMaxAttentionTile, n - s), 0, 1};
      const int first_pos = token_pos_[tile.first_token];
      const int first_key =
          window > 0 ? std::max(0, first_pos - window + 1) : 0;  // kernels::WindowStart
      tile.first_range = first_key / chunk;
      tile.n_ranges = (first_pos + tile.n - 1) / chunk - tile.first_range + 1;
      tiles_.push_back(tile);
    }
    t += n;
  }
  const int64_t tasks = static_cast<int64_t>(tiles_.size()) * n_kv;  // (tile, kv head)
  const int64_t qd = config_.q_dim();
  auto args_of = [&](const AttentionTile& tile) {
    return AttentionArgs{&kv, layer, batch[tile.item].block_table, config_.n_heads, scale, window};
  };
  // Task `task`'s key range r into acc ((n, q_dim) like attn_, only its heads written) and st
  // (n * group).
  auto range_partial = [&](int64_t task, int r, float* acc, kernels::AttentionRowState* st) {
    const AttentionTile& tile = tiles_[task / n_kv];
    AttentionArgs args = args_of(tile);
    args.key_begin = (tile.first_range + r) * chunk;
    args.key_end = args.key_begin + chunk;
    args.partial = st;
    AttendTile(args, token_pos_[tile.first_token], tile.n, static_cast<int>(task % n_kv),
               &q_[tile.first_token * qd], qd, acc, qd);
  };
  // Folds one range's partial into the running one, token by token (each token's group of
  // heads is contiguous in the (n, q_dim) layout).
  auto fold = [&](int64_t task, const float* acc, const kernels::AttentionRowState* st,
                  float* run_acc, kernels::AttentionRowState* run_st) {
    const AttentionTile& tile = tiles_[task / n_kv];
    const int64_t head = (task % n_kv) * group * hd;
    for (int t = 0; t < tile.n; ++t) {
      kernels::FoldAttentionPartial(group, hd, acc + t * qd + head, st + t * group,
                                    run_acc + t * qd + head, run_st + t * group);
    }
  };
  auto finish = [&](int64_t task, const float* run_acc, const kernels::AttentionRowState* run_st) {
    const AttentionTile& tile = tiles_[task / n_kv];
    const int64_t head = (task % n_kv) * group * hd;
    for (int t = 0; t < tile.n; ++t) {
      kernels::NormalizeAttentionRows(group, group, hd, run_acc + t * qd + head, run_st + t * group,
                                      &attn_[(tile.first_token + t) * qd + head], qd);
    }
  };
  const int threads = pool_ != nullptr ? pool_->num_threads() : 1;
  bool long_context = false;
  for (const AttentionTile& tile : tiles_) long_context = long_context || tile.n_ranges > 1;

  if (!long_context || tasks >= threads) {
    // A task per (tile, kv head); a task over several ranges folds them in order itself.
    auto run = [&](int64_t begin, int64_t end, int) {
      thread_local std::vector<float> acc, run_acc;
      thread_local std::vector<kernels::AttentionRowState> st, run_st;
      for (int64_t task = begin; task < end; ++task) {
        const AttentionTile& tile = tiles_[task / n_kv];
        if (tile.n_ranges == 1) {
          AttendTile(args_of(tile), token_pos_[tile.first_token], tile.n,
                     static_cast<int>(task % n_kv), &q_[tile.first_token * qd], qd,
                     &attn_[tile.first_token * qd], qd);
          continue;
        }
        acc.assign(tile.n * qd, 0.0f);
        run_acc.assign(tile.n * qd, 0.0f);
        st.assign(tile.n * group, {});
        run_st.assign(tile.n * group, {-INFINITY, 0.0f});
        for (int r = 0; r < tile.n_ranges; ++r) {
          range_partial(task, r, acc.data(), st.data());
          fold(task, acc.data(), st.data(), run_acc.data(), run_st.data());
        }
        finish(task, run_acc.data(), run_st.data());
      }
    };
    if (pool_ != nullptr) {
      pool_->ParallelFor(tasks, run);
    } else {
      run(0, tasks, 0);
    }
    return;
  }

  // Fewer tasks than threads and a long context (decode of one long sequence): the ranges run
  // in parallel into their own partials, then each task folds its ranges in the same order as
  // above, so the result is bit for bit the same whichever way the step was split.
  struct Unit {
    int64_t task;
    int range;
    int64_t acc_offset, st_offset;  // into range_acc_ / range_st_
  };
  std::vector<Unit> units;
  int64_t acc_size = 0, st_size = 0;
  for (int64_t task = 0; task < tasks; ++task) {
    const AttentionTile& tile = tiles_[task / n_kv];
    for (int r = 0; r < tile.n_ranges; ++r) {
      units.push_back({task, r, acc_size, st_size});
      acc_size += tile.n * qd;
      st_size += tile.n * group;
    }
  }
  range_acc_.assign(acc_size, 0.0f);
  range_st_.assign(st_size, {});
  pool_->ParallelFor(static_cast<int64_t>(units.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t u = begin; u < end; ++u) {
      range_partial(units[u].task, units[u].range, &range_acc_[units[u].acc_offset],
                    &range_st_[units[u].st_offset]);
    }
  });
  std::vector<float> run_acc;
  std::vector<kernels::AttentionRowState> run_st;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t task = units[u].task;
    const AttentionTile& tile = tiles_[task / n_kv];
    if (units[u].range == 0) {
      run_acc.assign(tile.n * qd, 0.0f);
      run_st.assign(tile.n * group, {-INFINITY, 0.0f});
    }
    fold(task, &range_acc_[units[u].acc_offset], &range_st_[units[u].st_offset], run_acc.data(),
         run_st.data());
    if (units[u].range == tile.n_ranges - 1) finish(task, run_acc.data(), run_st.data());
  }
}

Status Transformer::ForwardLayers(std::span<const BatchItem> batch, PagedKvCache& kv,
                                  int begin_layer, int end_layer, std::span<const float> hidden_in,
                                  std::vector<float>* hidden_out, std::vector<float>* logits) {
  const auto& c = config_;
  const int bt = kv.shape().block_tokens;
  if (begin_layer < 0 || end_layer > c.n_layers || begin_layer >= end_layer) {
    return InvalidArgument("layers " + std::to_string(begin_layer) + ".." +
                           std::to_string(end_layer) + " are not a range of the model's " +
                           std::to_string(c.n_layers));
  }
  if (end_layer < c.n_layers && hidden_out == nullptr) {
    return InvalidArgument("a stage that ends before the last layer needs hidden_out");
  }
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
    TANDEM_RETURN_IF_ERROR(kv.CheckWindow(item.block_table, item.start_pos, end));
    for (size_t j = 0; j < item.tokens.size(); ++j) {
      token_pos_.push_back(item.start_pos + static_cast<int>(j));
      token_item_.push_back(static_cast<int>(i));
    }
    logit_rows +=
        item.all_logits ? static_cast<int64_t>(item.tokens.size()) : (item.want_logits ? 1 : 0);
  }
  const int64_t T = static_cast<int64_t>(token_pos_.size());
  if (begin_layer > 0 && static_cast<int64_t>(hidden_in.size()) != T * c.dim) {
    return InvalidArgument("the hidden states hold " + std::to_string(hidden_in.size()) +
                           " values; " + std::to_string(T) + " tokens of width " +
                           std::to_string(c.dim) + " need " + std::to_string(T * c.dim));
  }
  if (mock_) {
    mock_->Run(batch, begin_layer, end_layer, c.n_layers, on_layer_done_, logit_rows, c.vocab_size,
               c.dim, hidden_out, logits);
    return OkStatus();
  }
  EnsureScratch(T, logit_rows);
  ComputeRope(c.rope_freq_base, c.rope_freq_scale, &rope_);
  const bool any_sliding = c.sliding_window > 0 && c.NumGlobalLayers() < c.n_layers;
  if (any_sliding) ComputeRope(c.rope_freq_base_swa, c.rope_freq_scale_swa, &rope_swa_);

  if (begin_layer == 0) {
    Embed(batch);
  } else {
    std::copy(hidden_in.begin(), hidden_in.end(), x_.begin());
  }
  for (int l = begin_layer; l < end_layer; ++l) Layer(batch, kv, l);
  if (end_layer < c.n_layers) {
    hidden_out->assign(x_.begin(), x_.begin() + T * c.dim);
    return OkStatus();
  }
  Head(batch, logit_rows, logits);
  return OkStatus();
}

void Transformer::Embed(std::span<const BatchItem> batch) {
  const auto& c = config_;
  for (int64_t t = 0, i = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    for (int32_t tok : batch[i].tokens) {
      float* xt = &x_[t * c.dim];
      kernels::DequantizeWeightRow(weights_.token_embd, tok, xt);
      if (c.embedding_scale != 1.0f) {
        for (int i = 0; i < c.dim; ++i) xt[i] *= c.embedding_scale;
      }
      ++t;
    }
  }
}

void Transformer::Layer(std::span<const BatchItem> batch, PagedKvCache& kv, int l) {
  const auto& c = config_;
  const int64_t T = static_cast<int64_t>(token_pos_.size());
  const LayerWeights& L = weights_.layers[l];
  ParallelRows(T, [&](int64_t b, int64_t e) {
    RmsNorm(&x_[b * c.dim], L.attn_norm.data(), e - b, c.dim, c.rms_eps, &xn_[b * c.dim]);
  });
  const kernels::MatMulOutput qkv[] = {{L.wq, q_.data()}, {L.wk, k_.data()}, {L.wv, v_.data()}};
  kernels::MatMulShared(qkv, xn_.data(), T, pool_);
  if (c.qk_norm) {
    HeadNorm(q_.data(), c.n_heads, L.attn_q_norm);
    HeadNorm(k_.data(), c.n_kv_heads, L.attn_k_norm);
  }
  const RopeTable& rope = c.IsSlidingLayer(l) ? rope_swa_ : rope_;
  ApplyRope(rope, q_.data(), c.n_heads);
  ApplyRope(rope, k_.data(), c.n_kv_heads);
  WriteKv(batch, kv, l);
  if (on_layer_done_) on_layer_done_(l);
  RoundQueriesToFp16(T * c.q_dim());
  Attention(batch, kv, l);
  kernels::MatMul(L.wo, attn_.data(), T, xn_.data(), pool_);
  if (c.post_norms) PostNorm(L.attn_post_norm, T);
  for (int64_t i = 0; i < T * c.dim; ++i) x_[i] += xn_[i];

  ParallelRows(T, [&](int64_t b, int64_t e) {
    RmsNorm(&x_[b * c.dim], L.ffn_norm.data(), e - b, c.dim, c.rms_eps, &xn_[b * c.dim]);
  });
  const kernels::MatMulOutput gate_up[] = {{L.w_gate, gate_.data()}, {L.w_up, up_.data()}};
  kernels::MatMulShared(gate_up, xn_.data(), T, pool_);
  ParallelRows(T, [&](int64_t b, int64_t e) {
    const int64_t n = (e - b) * c.ffn_dim;
    if (c.ffn_activation == model::FfnActivation::kGeluTanh) {
      kernels::GeluMul(&gate_[b * c.ffn_dim], &up_[b * c.ffn_dim], n);
    } else {
      kernels::SiluMul(&gate_[b * c.ffn_dim], &up_[b * c.ffn_dim], n);
    }
  });
  kernels::MatMul(L.w_down, gate_.data(), T, xn_.data(), pool_);
  if (c.post_norms) PostNorm(L.ffn_post_norm, T);
  for (int64_t i = 0; i < T * c.dim; ++i) x_[i] += xn_[i];
}

void Transformer::Head(std::span<const BatchItem> batch, int64_t logit_rows,
                       std::vector<float>* logits) {
  const auto& c = config_;
  std::vector<float>& picked = logit_in_;
  picked.resize(logit_rows * c.dim);
  for (int64_t t = 0, i = 0, r = 0; i < static_cast<int64_t>(batch.size()); ++i) {
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    t += n;
    if (batch[i].all_logits) {
      RmsNorm(&x_[(t - n) * c.dim], weights_.output_norm.data(), n, c.dim, c.rms_eps,
              &picked[r * c.dim]);
      r += n;
      continue;
    }
    if (!batch[i].want_logits) continue;
    RmsNorm(&x_[(t - 1) * c.dim], weights_.output_norm.data(), 1, c.dim, c.rms_eps,
            &picked[r * c.dim]);
    ++r;
  }
  logits->resize(logit_rows * c.vocab_size);
  if (logit_rows > 0)
    kernels::MatMul(weights_.output, picked.data(), logit_rows, logits->data(), pool_);
  if (const float cap = c.final_logit_softcap; cap > 0) {
    for (float& z : *logits) z = cap * std::tanh(z / cap);
  }
}

}  // namespace tandem::engine
