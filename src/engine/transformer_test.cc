#include "engine/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "common/fp16.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "engine/test_model.h"
#include "kernels/activations.h"
#include "kernels/cpu_isa.h"
#include "kernels/matmul.h"

namespace tandem::engine {
namespace {

// A loaded tiny model with its own KV cache, laid out as the engine lays it out (sliding
// layers in a window arena of `window_blocks` blocks; 0: one per block).
struct Fixture {
  explicit Fixture(const testing::TinyLlamaSpec& spec, int threads = 2, int block_tokens = 8,
                   int num_blocks = 64, int window_blocks = 0)
      : pool(threads) {
    path = testing::WriteTinyLlama(spec);
    file = std::move(model::GgufFile::Open(path).value());
    config = model::ReadModelConfig(*file).value();
    weights = BindWeights(*file, config).value();
    tf = std::make_unique<Transformer>(config, weights, &pool);
    EngineOptions layout;
    layout.block_tokens = block_tokens;
    KvCacheShape shape = KvShapeFor(config, layout, int64_t{num_blocks} * block_tokens);
    if (window_blocks > 0) shape.num_window_blocks = window_blocks;
    kv = std::move(PagedKvCache::Create(shape).value());
  }
  ~Fixture() { std::remove(path.c_str()); }

  // One forward step: window storage attached to the items' new positions first, and (with
  // `trim`) taken back after from the blocks every item has moved past.
  Status Step(std::span<const BatchItem> items, std::vector<float>* logits) {
    for (const BatchItem& item : items) {
      TANDEM_RETURN_IF_ERROR(
          kv->AttachWindow(item.block_table, item.start_pos, item.start_pos + item.tokens.size()));
    }
    TANDEM_RETURN_IF_ERROR(tf->Forward(items, *kv, logits));
    if (trim) {
      for (const BatchItem& item : items)
        kv->TrimWindow(item.block_table, item.start_pos + item.tokens.size());
    }
    return OkStatus();
  }

  // Prefill `prompt` (in chunks of `chunk`) then feed `extra` one at a time; returns the logits
  // after the prompt and after each extra token, concatenated.
  std::vector<float> RunAlone(const std::vector<int32_t>& prompt, const std::vector<int32_t>& extra,
                              const std::vector<int32_t>& blocks, int chunk = 1 << 20) {
    std::vector<float> all, logits;
    for (size_t s = 0; s < prompt.size(); s += chunk) {
      const size_t n = std::min<size_t>(chunk, prompt.size() - s);
      BatchItem item{blocks, static_cast<int>(s), {prompt.data() + s, n}, s + n == prompt.size()};
      const Status st = Step({&item, 1}, &logits);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    all = logits;
    for (size_t i = 0; i < extra.size(); ++i) {
      BatchItem item{blocks, static_cast<int>(prompt.size() + i), {&extra[i], 1}, true};
      const Status st = Step({&item, 1}, &logits);
      EXPECT_TRUE(st.ok()) << st.ToString();
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  bool trim = false;
  std::string path;
  ThreadPool pool;
  std::unique_ptr<model::GgufFile> file;
  model::ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<PagedKvCache> kv;
};

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

std::vector<int32_t> Range(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// A plain float reference of the forward pass (Llama, or Gemma 3 per the config) for one
// sequence: dequantized weights, float activations, K/V rounded to fp16 as the cache stores them
// and Q as the engine rounds it for attention, GELU as kernels::GeluMul defines it (its scalar
// path). Returns logits of every position, (n, vocab).
std::vector<float> ReferenceForward(const Fixture& f, const std::vector<int32_t>& tokens) {
  const auto& c = f.config;
  const int n = static_cast<int>(tokens.size());
  const int hd = c.head_dim;
  auto deq = [](const kernels::WeightView& w) {
    std::vector<float> m(w.rows * w.cols);
    for (int64_t r = 0; r < w.rows; ++r) kernels::DequantizeWeightRow(w, r, &m[r * w.cols]);
    return m;
  };
  auto matvec = [](const std::vector<float>& m, int64_t rows, int64_t cols, const float* x,
                   float* y) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += static_cast<double>(m[r * cols + k]) * x[k];
      y[r] = static_cast<float>(s);
    }
  };
  auto rmsnorm_n = [&](const float* x, const std::vector<float>& w, int len, float* y) {
    double s = 0;
    for (int i = 0; i < len; ++i) s += static_cast<double>(x[i]) * x[i];
    const double scale = 1.0 / std::sqrt(s / len + c.rms_eps);
    for (int i = 0; i < len; ++i) y[i] = static_cast<float>(x[i] * scale * w[i]);
  };
  auto rmsnorm = [&](const float* x, const std::vector<float>& w, float* y) {
    rmsnorm_n(x, w, c.dim, y);
  };
  auto rope = [&](float* v, int pos, int layer) {
    const double base = c.IsSlidingLayer(layer) ? c.rope_freq_base_swa : c.rope_freq_base;
    const int half = c.rope_dim / 2;
    for (int i = 0; i < half; ++i) {
      const double theta = pos * std::pow(base, -2.0 * i / c.rope_dim);
      float* pa = c.rope_neox ? &v[i] : &v[2 * i];
      float* pb = c.rope_neox ? &v[i + half] : &v[2 * i + 1];
      const double a = *pa, b = *pb;
      *pa = static_cast<float>(a * std::cos(theta) - b * std::sin(theta));
      *pb = static_cast<float>(a * std::sin(theta) + b * std::cos(theta));
    }
  };
  auto gelu =
      [](float x) {  // the scalar kernel, checked against its definition in activations_test
        float one = 1.0f;
        kernels::GeluMulScalar(&x, &one, 1);
        return x;
      };
  const auto embd = deq(f.weights.token_embd);
  std::vector<float> x(n * c.dim);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < c.dim; ++i)
      x[t * c.dim + i] = embd[tokens[t] * c.dim + i] * c.embedding_scale;
  }
  std::vector<float> xn(c.dim), q(n * c.q_dim()), k(n * c.kv_dim()), v(n * c.kv_dim());
  std::vector<float> att(c.q_dim()), tmp(std::max(c.dim, c.ffn_dim)), g(c.ffn_dim), u(c.ffn_dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = f.weights.layers[l];
    const int window = c.IsSlidingLayer(l) ? c.sliding_window : 0;
    const auto wq = deq(L.wq), wk = deq(L.wk), wv = deq(L.wv), wo = deq(L.wo);
    const auto wg = deq(L.w_gate), wu = deq(L.w_up), wd = deq(L.w_down);
    for (int t = 0; t < n; ++t) {
      rmsnorm(&x[t * c.dim], L.attn_norm, xn.data());
      matvec(wq, c.q_dim(), c.dim, xn.data(), &q[t * c.q_dim()]);
      matvec(wk, c.kv_dim(), c.dim, xn.data(), &k[t * c.kv_dim()]);
      matvec(wv, c.kv_dim(), c.dim, xn.data(), &v[t * c.kv_dim()]);
      for (int h = 0; h < c.n_heads; ++h) {
        float* qh = &q[t * c.q_dim() + h * hd];
        if (c.qk_norm) rmsnorm_n(qh, L.attn_q_norm, hd, qh);
        rope(qh, t, l);
        for (int e = 0; e < hd; ++e) qh[e] = Fp16ToFp32(Fp32ToFp16(qh[e]));
      }
      for (int h = 0; h < c.n_kv_heads; ++h) {
        float* kh = &k[t * c.kv_dim() + h * hd];
        if (c.qk_norm) rmsnorm_n(kh, L.attn_k_norm, hd, kh);
        rope(kh, t, l);
      }
      for (int i = 0; i < c.kv_dim(); ++i) {
        k[t * c.kv_dim() + i] = Fp16ToFp32(Fp32ToFp16(k[t * c.kv_dim() + i]));
        v[t * c.kv_dim() + i] = Fp16ToFp32(Fp32ToFp16(v[t * c.kv_dim() + i]));
      }
    }
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / (c.n_heads / c.n_kv_heads);
        const int j0 = window > 0 ? std::max(0, t - window + 1) : 0;  // first visible key
        std::vector<double> s(t + 1, 0.0);
        double mx = -1e300;
        for (int j = j0; j <= t; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e)
            d += q[t * c.q_dim() + h * hd + e] * k[j * c.kv_dim() + kvh * hd + e];
          s[j] = d * c.attention_scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = j0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int e = 0; e < hd; ++e) {
          double acc = 0;
          for (int j = j0; j <= t; ++j) acc += s[j] / sum * v[j * c.kv_dim() + kvh * hd + e];
          att[h * hd + e] = static_cast<float>(acc);
        }
      }
      matvec(wo, c.dim, c.q_dim(), att.data(), tmp.data());
      if (c.post_norms) rmsnorm(tmp.data(), L.attn_post_norm, tmp.data());
      for (int i = 0; i < c.dim; ++i) x[t * c.dim + i] += tmp[i];
      rmsnorm(&x[t * c.dim], L.ffn_norm, xn.data());
      matvec(wg, c.ffn_dim, c.dim, xn.data(), g.data());
      matvec(wu, c.ffn_dim, c.dim, xn.data(), u.data());
      for (int i = 0; i < c.ffn_dim; ++i) {
        g[i] =
            (c.ffn_activation == model::FfnActivation::kGeluTanh ? gelu(g[i])
                                                                 : g[i] / (1 + std::exp(-g[i]))) *
            u[i];
      }
      matvec(wd, c.dim, c.ffn_dim, g.data(), tmp.data());
      if (c.post_norms) rmsnorm(tmp.data(), L.ffn_post_norm, tmp.data());
      for (int i = 0; i < c.dim; ++i) x[t * c.dim + i] += tmp[i];
    }
  }
  const auto out = deq(f.weights.output);
  std::vector<float> logits(n * c.vocab_size);
  for (int t = 0; t < n; ++t) {
    rmsnorm(&x[t * c.dim], f.weights.output_norm, xn.data());
    matvec(out, c.vocab_size, c.dim, xn.data(), &logits[t * c.vocab_size]);
  }
  return logits;
}

// A Gemma 3 shaped tiny model: head_dim apart from dim / n_heads, one KV head, three layers of
// which the first two slide over 8 positions, so 21-token sequences leave every window.
testing::TinyLlamaSpec TinyGemma() {
  testing::TinyLlamaSpec spec;
  spec.gemma3 = true;
  spec.n_layers = 3;
  spec.n_kv_heads = 1;
  spec.head_dim = 32;
  spec.sliding_window = 8;
  spec.swa_pattern = 3;
  return spec;
}

// Both families, for the properties every model must have.
std::vector<testing::TinyLlamaSpec> BothFamilies() {
  return {testing::TinyLlamaSpec{}, TinyGemma()};
}

// With float weights the only approximations left are the fp16 KV cache and queries (shared
// with the reference) and summation order: logits must agree closely at every position.
class TransformerBlockSizeTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Block size 8 exercises the portable attention, 16 the vector one (where the CPU has it);
// the second parameter picks the Gemma 3 model.
TEST_P(TransformerBlockSizeTest, MatchesFloatReference) {
  testing::TinyLlamaSpec spec = std::get<1>(GetParam()) ? TinyGemma() : testing::TinyLlamaSpec{};
  spec.matrix_dtype = DType::kF32;
  spec.embd_dtype = DType::kF32;
  Fixture f(spec, /*threads=*/2, /*block_tokens=*/std::get<0>(GetParam()));
  const auto tokens = RandomTokens(21, spec.vocab, 3);
  const auto ref = ReferenceForward(f, tokens);
  // Feed the first 13 as one prefill chunk, then the rest one at a time (decode).
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 13);
  const std::vector<int32_t> extra(tokens.begin() + 13, tokens.end());
  const auto got = f.RunAlone(prompt, extra, Range(0, 4));
  const int V = spec.vocab;
  // The amx path rounds attention's inputs to bf16: up to one unit of 2^-8 of the largest logit
  // (see AttentionIsaPathsAgree); the float paths stay within 2e-3.
  float tolerance = 2e-3f;
  if (std::string(kernels::ActiveIsa()) == "amx") {
    for (float z : ref) tolerance = std::max(tolerance, 0x1p-8f * std::fabs(z));
  }
  for (int step = 0; step <= static_cast<int>(extra.size()); ++step) {
    const int pos = 12 + step;
    for (int i = 0; i < V; ++i) {
      ASSERT_NEAR(got[step * V + i], ref[pos * V + i], tolerance)
          << "position " << pos << " id " << i;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(BlockTokensAndFamily, TransformerBlockSizeTest,
                         ::testing::Combine(::testing::Values(8, 16), ::testing::Bool()));

// Attention split into key ranges of 32 positions (the default is 2,048; a short context
// exercises the same path): logits still match the float reference, and a decode step gives the
// same bits alone (Gemma's one KV head: fewer tasks than threads, so its ranges run in parallel)
// as beside other sequences (enough tasks: each folds its ranges itself), at 1 and 2 threads.
TEST(TransformerTest, AttentionKeyRangesMatchTheReferenceAndKeepBatchInvariance) {
  for (const bool gemma : {false, true}) {
    SCOPED_TRACE(gemma ? "gemma3" : "llama");
    testing::TinyLlamaSpec spec = gemma ? TinyGemma() : testing::TinyLlamaSpec{};
    spec.matrix_dtype = DType::kF32;
    spec.embd_dtype = DType::kF32;
    std::vector<float> decoded_alone[2];
    for (int threads : {1, 2}) {
      Fixture f(spec, threads, /*block_tokens=*/16, /*num_blocks=*/32);
      ASSERT_TRUE(f.tf->SetAttentionChunk(32).ok());
      EXPECT_FALSE(f.tf->SetAttentionChunk(40).ok());
      const auto tokens = RandomTokens(90, spec.vocab, 5);
      const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 70);
      const std::vector<int32_t> extra(tokens.begin() + 70, tokens.end());
      // Prefill in chunks of 25 (tiles that straddle range boundaries), then decode 20 tokens.
      decoded_alone[threads - 1] = f.RunAlone(prompt, extra, Range(0, 6), /*chunk=*/25);
      const auto& got = decoded_alone[threads - 1];
      const auto ref = ReferenceForward(f, tokens);
      const int V = spec.vocab;
      float tolerance = 2e-3f;
      if (std::string(kernels::ActiveIsa()) == "amx") {
        for (float z : ref) tolerance = std::max(tolerance, 0x1p-8f * std::fabs(z));
      }
      for (int step = 0; step <= static_cast<int>(extra.size()); ++step) {
        for (int i = 0; i < V; ++i) {
          ASSERT_NEAR(got[step * V + i], ref[(69 + step) * V + i], tolerance)
              << "position " << 69 + step << " id " << i;
        }
      }
      // The same sequence again in other blocks, its decode steps each beside a fresh prompt.
      const auto blocks = Range(6, 6), other_blocks = Range(12, 2);
      const auto other = RandomTokens(24, spec.vocab, 6);
      std::vector<float> logits;
      BatchItem pre{blocks, 0, {prompt.data(), prompt.size()}, true};
      ASSERT_TRUE(f.Step({&pre, 1}, &logits).ok());
      EXPECT_EQ(MaxAbsDiff(logits, std::vector<float>(got.begin(), got.begin() + V)), 0.0f);
      for (size_t i = 0; i < extra.size(); ++i) {
        BatchItem items[] = {
            {other_blocks, 0, {other.data(), 3 + i}, true},
            {blocks, static_cast<int>(prompt.size() + i), {&extra[i], 1}, true},
        };
        ASSERT_TRUE(f.Step(items, &logits).ok());
        ASSERT_EQ(logits.size(), 2u * V);
        EXPECT_EQ(
            MaxAbsDiff(std::vector<float>(logits.begin() + V, logits.end()),
                       std::vector<float>(got.begin() + (i + 1) * V, got.begin() + (i + 2) * V)),
            0.0f)
            << "decode step " << i;
      }
    }
    EXPECT_EQ(MaxAbsDiff(decoded_alone[0], decoded_alone[1]), 0.0f);  // threads change nothing
  }
}

// The file's Gemma 3 keys become the config the forward pass follows.
TEST(TransformerTest, TinyGemmaConfig) {
  Fixture f(TinyGemma());
  const model::ModelConfig& c = f.config;
  EXPECT_EQ(c.arch, model::Architecture::kGemma3);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_TRUE(c.IsSlidingLayer(0));
  EXPECT_TRUE(c.IsSlidingLayer(1));
  EXPECT_FALSE(c.IsSlidingLayer(2));
  EXPECT_EQ(c.NumGlobalLayers(), 1);
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.0f);
}

// Quantized weights: the reference uses the same dequantized weights but float activations,
// so the gap is the activation quantization (Q8) only.
TEST(TransformerTest, QuantizedModelTracksReference) {
  for (DType t :
       {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K, DType::kF16}) {
    testing::TinyLlamaSpec spec;
    spec.matrix_dtype = t;
    spec.dim = 256;  // K-quants need rows of 256
    spec.ffn_dim = 512;
    spec.n_heads = 4;
    Fixture f(spec);
    const auto tokens = RandomTokens(9, spec.vocab, 5);
    const auto ref = ReferenceForward(f, tokens);
    const auto got = f.RunAlone(tokens, {}, Range(0, 2));
    const int V = spec.vocab;
    double err = 0, norm = 0;
    for (int i = 0; i < V; ++i) {
      const double r = ref[8 * V + i];
      err += (got[i] - r) * (got[i] - r);
      norm += r * r;
    }
    EXPECT_LT(std::sqrt(err / norm), 0.05) << GetDTypeInfo(t).name;
  }
}

// One mixed batch (a prefill chunk, a decode step and a fresh prompt together) gives exactly the
// same logits as running each sequence alone.
TEST(TransformerTest, MixedBatchEqualsOneSequenceAtATime) {
  for (const testing::TinyLlamaSpec& spec : BothFamilies()) {
    SCOPED_TRACE(spec.gemma3 ? "gemma3" : "llama");
    Fixture f(spec);
    const auto a = RandomTokens(19, spec.vocab, 11);  // prefilled earlier, then one decode token
    const auto b = RandomTokens(10, spec.vocab, 12);  // prefilled in two chunks: 6 then 4
    const auto c = RandomTokens(7, spec.vocab, 13);   // whole prompt inside the mixed step
    const auto blocks_a = Range(0, 4), blocks_b = Range(10, 2), blocks_c = Range(20, 1);
    const int V = spec.vocab;

    const auto alone_a = f.RunAlone({a.begin(), a.end() - 1}, {a.back()}, blocks_a);
    const auto alone_b = f.RunAlone(b, {}, blocks_b);
    const auto alone_c = f.RunAlone(c, {}, blocks_c);

    std::vector<float> logits;
    BatchItem pre_a{blocks_a, 0, {a.data(), a.size() - 1}, false};
    BatchItem pre_b{blocks_b, 0, {b.data(), 6}, false};
    BatchItem first[] = {pre_a, pre_b};
    ASSERT_TRUE(f.Step(first, &logits).ok());
    EXPECT_TRUE(logits.empty());
    BatchItem mixed[] = {
        {blocks_b, 6, {b.data() + 6, 4}, true},
        {blocks_a, static_cast<int>(a.size() - 1), {&a.back(), 1}, true},
        {blocks_c, 0, {c.data(), c.size()}, true},
    };
    ASSERT_TRUE(f.Step(mixed, &logits).ok());
    ASSERT_EQ(logits.size(), 3u * V);
    auto row = [&](int r) {
      return std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    };
    EXPECT_EQ(MaxAbsDiff(row(0), alone_b), 0.0f);  // bit-identical: kernels are batch-invariant
    EXPECT_EQ(MaxAbsDiff(row(1), std::vector<float>(alone_a.end() - V, alone_a.end())), 0.0f);
    EXPECT_EQ(MaxAbsDiff(row(2), alone_c), 0.0f);
  }
}

// all_logits (prompt logprobs): one row per token, each what decoding the tokens one at a time
// gives at that position; beside an ordinary item in the same step.
TEST(TransformerTest, AllLogitsRowsEqualOneTokenAtATime) {
  for (const testing::TinyLlamaSpec& spec : BothFamilies()) {
    SCOPED_TRACE(spec.gemma3 ? "gemma3" : "llama");
    Fixture f(spec);
    const int V = spec.vocab;
    const auto tokens = RandomTokens(9, spec.vocab, 31);
    const auto other = RandomTokens(5, spec.vocab, 32);
    const auto one_at_a_time =
        f.RunAlone({tokens.front()}, {tokens.begin() + 1, tokens.end()}, Range(0, 2));
    const auto other_alone = f.RunAlone(other, {}, Range(2, 1));
    std::vector<float> logits;
    const auto blocks_t = Range(3, 2), blocks_o = Range(5, 1);
    BatchItem items[] = {{blocks_t, 0, {tokens.data(), tokens.size()}, true, true},
                         {blocks_o, 0, {other.data(), other.size()}, true}};
    const Status st = f.Step(items, &logits);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(logits.size(), (tokens.size() + 1) * V);
    EXPECT_EQ(MaxAbsDiff(std::vector<float>(logits.begin(), logits.begin() + tokens.size() * V),
                         one_at_a_time),
              0.0f);
    EXPECT_EQ(MaxAbsDiff(std::vector<float>(logits.end() - V, logits.end()), other_alone), 0.0f);
  }
}

// Scattered, out-of-order blocks give the same result as contiguous ones, and chunked prefill
// equals whole prefill.
TEST(TransformerTest, ScatteredBlocksAndChunksEqualContiguous) {
  for (const testing::TinyLlamaSpec& spec : BothFamilies()) {
    SCOPED_TRACE(spec.gemma3 ? "gemma3" : "llama");
    Fixture f(spec);
    const auto tokens = RandomTokens(30, spec.vocab, 21);
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 26);
    const std::vector<int32_t> extra(tokens.begin() + 26, tokens.end());
    const auto contiguous = f.RunAlone(prompt, extra, Range(0, 4));
    const auto scattered = f.RunAlone(prompt, extra, {41, 7, 63, 12});
    const auto chunked = f.RunAlone(prompt, extra, {5, 50, 33, 2}, /*chunk=*/5);
    EXPECT_EQ(MaxAbsDiff(contiguous, scattered), 0.0f);
    EXPECT_EQ(MaxAbsDiff(contiguous, chunked), 0.0f);
  }
}

// The attention kernel's vector paths against the portable one, through a whole forward pass.
// Skipped where the CPU has no vector path (every run would take the portable one); the forced
// instruction set is restored however the test ends.
TEST(TransformerTest, AttentionIsaPathsAgree) {
  int compared = 0;
  for (testing::TinyLlamaSpec spec : BothFamilies()) {
    SCOPED_TRACE(spec.gemma3 ? "gemma3" : "llama");
    spec.dim = 128;            // head_dim 32; the vector paths need 16-token blocks
    spec.sliding_window = 20;  // a window that starts inside a block
    // Float matrices: no 8-bit activation rounding to turn summation-order noise into steps of
    // a whole quantum (with Q4_1 a flip moves Gemma's logits by 0.1).
    spec.matrix_dtype = DType::kF32;
    spec.embd_dtype = DType::kF32;
    Fixture f(spec, /*threads=*/2, /*block_tokens=*/16);
    const auto tokens = RandomTokens(40, spec.vocab, 31);
    std::vector<float> scalar;
    {
      kernels::ScopedIsa forced("scalar");
      ASSERT_TRUE(forced.ok());
      scalar = f.RunAlone(tokens, {}, Range(0, 5));
    }
    float largest = 0;
    for (float z : scalar) largest = std::max(largest, std::fabs(z));
    for (const char* isa : {"avx2", "avx512", "amx"}) {
      kernels::ScopedIsa forced(isa);
      if (!forced.ok()) continue;
      SCOPED_TRACE(isa);
      ++compared;
      const auto vec = f.RunAlone(tokens, {}, Range(0, 5));
      // Relative to the largest logit: float summation order alone gives ~1e-7 (Llama, 8e-8
      // measured); Gemma's fp16 roundings (queries, GELU input) turn some of that into 2^-11
      // steps of single elements (4e-7 measured). The amx path rounds attention's inputs to
      // bf16 (unit roundoff 2^-8), which bounds its error at one such unit of the largest logit
      // (4e-4 / 1.4e-4 measured). A wrong mask or block is orders larger; the kernel's own test
      // (kernels/attention_test.cc) bounds each path tightly.
      const float tolerance = std::string(isa) == "amx" ? 0x1p-8f : 2e-6f;
      EXPECT_LT(MaxAbsDiff(scalar, vec), tolerance * largest);
    }
  }
  if (compared == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
}

// Sliding layers keep KV only for the window: a long sequence whose window storage is taken
// back as it moves gives bit-identical logits to one that keeps everything, in an arena that
// holds a single sequence's window, and a step over a window whose storage is gone is refused.
TEST(TransformerTest, TrimmedWindowsGiveTheSameLogits) {
  const testing::TinyLlamaSpec spec = TinyGemma();  // window 8; layers 0 and 1 slide
  const auto tokens = RandomTokens(60, spec.vocab, 41);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 45);
  const std::vector<int32_t> extra(tokens.begin() + 45, tokens.end());
  const int bt = 4, chunk = 6;
  Fixture keep(spec, 2, bt, /*num_blocks=*/16);
  const auto expected = keep.RunAlone(prompt, extra, Range(0, 15), chunk);
  EXPECT_EQ(keep.kv->num_free_window(), 16 - 15);  // nothing taken back

  const int arena = keep.kv->shape().WindowBlocksFor(1, chunk);
  Fixture trimmed(spec, 2, bt, /*num_blocks=*/16, arena);
  trimmed.trim = true;
  const std::vector<int32_t> blocks = trimmed.kv->Allocate(15).value();  // held once: trimmable
  EXPECT_EQ(MaxAbsDiff(trimmed.RunAlone(prompt, extra, blocks, chunk), expected), 0.0f);
  // After position 59 the window (52..59) spans blocks 13 and 14 only.
  EXPECT_EQ(trimmed.kv->num_window_blocks() - trimmed.kv->num_free_window(), 2);
  EXPECT_EQ(trimmed.kv->ResumablePrefix(blocks, 15), 15);
  EXPECT_EQ(trimmed.kv->ResumablePrefix(blocks, 12), 0);  // window 41..48 is gone
  // Resuming at position 20 reads blocks 3 and 4, whose sliding KV was taken back.
  std::vector<float> logits;
  BatchItem resume{blocks, 20, {tokens.data() + 20, 1}, true};
  EXPECT_EQ(trimmed.tf->Forward({&resume, 1}, *trimmed.kv, &logits).code(),
            StatusCode::kFailedPrecondition);
}

// Pipelined prefill: two workers, each with its own KV cache, run layers [0, split) and
// [split, n_layers) chunk by chunk, the first passing its residual stream to the second. The
// logits after the prompt, and every layer's KV in the cache of the stage that computed it, are
// bit for bit those of one worker running the whole model.
TEST(TransformerTest, PipelineStagesEqualTheWholeModel) {
  for (testing::TinyLlamaSpec spec : BothFamilies()) {
    SCOPED_TRACE(spec.gemma3 ? "gemma3" : "llama");
    spec.n_layers = spec.gemma3 ? 6 : 4;  // Gemma: layers 2 and 5 global
    const auto prompt = RandomTokens(37, spec.vocab, 51);
    const int chunk = 10;
    Fixture whole(spec);
    const std::vector<int32_t> blocks = Range(0, 5);
    const auto expected = whole.RunAlone(prompt, {}, blocks, chunk);
    for (int split = 1; split < spec.n_layers; ++split) {
      SCOPED_TRACE("split after layer " + std::to_string(split - 1));
      Fixture first(spec), second(spec);
      std::vector<float> hidden, logits;
      for (size_t s = 0; s < prompt.size(); s += chunk) {
        const size_t n = std::min<size_t>(chunk, prompt.size() - s);
        BatchItem item{blocks, static_cast<int>(s), {prompt.data() + s, n}, true};
        for (Fixture* f : {&first, &second}) {
          ASSERT_TRUE(f->kv->AttachWindow(blocks, item.start_pos, item.start_pos + n).ok());
        }
        ASSERT_TRUE(
            first.tf->ForwardLayers({&item, 1}, *first.kv, 0, split, {}, &hidden, &logits).ok());
        ASSERT_EQ(hidden.size(), n * first.config.dim);
        const std::vector<float> passed = hidden;
        ASSERT_TRUE(second.tf
                        ->ForwardLayers({&item, 1}, *second.kv, split, spec.n_layers, passed,
                                        &hidden, &logits)
                        .ok());
      }
      EXPECT_EQ(MaxAbsDiff(logits, expected), 0.0f);
      for (int l = 0; l < spec.n_layers; ++l) {
        PagedKvCache& staged = l < split ? *first.kv : *second.kv;
        for (int32_t b : blocks) {
          if (whole.kv->shape().IsSliding(l) && !whole.kv->HasWindow(b)) continue;
          ASSERT_EQ(0, std::memcmp(staged.data() + staged.LayerSliceOffset(b, l),
                                   whole.kv->data() + whole.kv->LayerSliceOffset(b, l),
                                   staged.LayerSliceBytes()))
              << "layer " << l << " block " << b;
        }
      }
    }
    // A stage that does not end the model must say where its output goes, and a later stage
    // needs one row of hidden state per token.
    std::vector<float> logits;
    BatchItem item{blocks, 0, {prompt.data(), 4}, true};
    ASSERT_TRUE(whole.kv->AttachWindow(blocks, 0, 4).ok());
    EXPECT_EQ(whole.tf->ForwardLayers({&item, 1}, *whole.kv, 0, 1, {}, nullptr, &logits).code(),
              StatusCode::kInvalidArgument);
    const std::vector<float> short_hidden(3 * whole.config.dim);
    EXPECT_EQ(
        whole.tf
            ->ForwardLayers({&item, 1}, *whole.kv, 1, spec.n_layers, short_hidden, nullptr, &logits)
            .code(),
        StatusCode::kInvalidArgument);
    EXPECT_EQ(whole.tf->ForwardLayers({&item, 1}, *whole.kv, 2, 2, {}, nullptr, &logits).code(),
              StatusCode::kInvalidArgument);
  }
}

TEST(TransformerTest, RefusesBadBatches) {
  testing::TinyLlamaSpec spec;
  Fixture f(spec);
  std::vector<float> logits;
  const std::vector<int32_t> ok_tokens = {1, 2, 3};
  const std::vector<int32_t> bad_token = {1, spec.vocab};
  const std::vector<int32_t> one_block = {0};
  BatchItem too_small{one_block, 7, ok_tokens, true};  // needs positions up to 9 (> 8 slots)
  EXPECT_EQ(f.tf->Forward({&too_small, 1}, *f.kv, &logits).code(), StatusCode::kInvalidArgument);
  BatchItem bad{one_block, 0, bad_token, true};
  EXPECT_EQ(f.tf->Forward({&bad, 1}, *f.kv, &logits).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_block = {9999};
  BatchItem bad_b{bad_block, 0, ok_tokens, true};
  EXPECT_EQ(f.tf->Forward({&bad_b, 1}, *f.kv, &logits).code(), StatusCode::kInvalidArgument);
  BatchItem empty{one_block, 0, {}, true};
  EXPECT_EQ(f.tf->Forward({&empty, 1}, *f.kv, &logits).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::engine
