#include "engine/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "common/fp16.h"
#include "engine/attention.h"
#include "engine/test_model.h"
#include "kernels/cpu_isa.h"
#include "kernels/matmul.h"

namespace tandem::engine {
namespace {

// A loaded tiny model with its own KV cache.
struct Fixture {
  explicit Fixture(const testing::TinyLlamaSpec& spec, int threads = 2, int block_tokens = 8,
                   int num_blocks = 64)
      : pool(threads) {
    path = testing::WriteTinyLlama(spec);
    file = std::move(model::GgufFile::Open(path).value());
    config = model::ReadLlamaConfig(*file).value();
    weights = BindWeights(*file, config).value();
    tf = std::make_unique<Transformer>(config, weights, &pool);
    KvCacheShape shape{config.n_layers, config.n_kv_heads, config.head_dim, block_tokens,
                       num_blocks};
    kv = std::move(PagedKvCache::Create(shape).value());
  }
  ~Fixture() { std::remove(path.c_str()); }

  // Prefill `prompt` (in chunks of `chunk`) then feed `extra` one at a time; returns the logits
  // after the prompt and after each extra token, concatenated.
  std::vector<float> RunAlone(const std::vector<int32_t>& prompt, const std::vector<int32_t>& extra,
                              const std::vector<int32_t>& blocks, int chunk = 1 << 20) {
    std::vector<float> all, logits;
    for (size_t s = 0; s < prompt.size(); s += chunk) {
      const size_t n = std::min<size_t>(chunk, prompt.size() - s);
      BatchItem item{blocks, static_cast<int>(s), {prompt.data() + s, n}, s + n == prompt.size()};
      EXPECT_TRUE(tf->Forward({&item, 1}, *kv, &logits).ok());
    }
    all = logits;
    for (size_t i = 0; i < extra.size(); ++i) {
      BatchItem item{blocks, static_cast<int>(prompt.size() + i), {&extra[i], 1}, true};
      EXPECT_TRUE(tf->Forward({&item, 1}, *kv, &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  std::string path;
  ThreadPool pool;
  std::unique_ptr<model::GgufFile> file;
  model::LlamaConfig config;
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

// A plain float reference of the Llama forward pass for one sequence (dequantized weights,
// float activations, K/V rounded to fp16 as the cache stores them). Returns logits of every
// position, (n, vocab).
std::vector<float> ReferenceForward(const Fixture& f, const std::vector<int32_t>& tokens) {
  const auto& c = f.config;
  const int n = static_cast<int>(tokens.size());
  const int hd = c.head_dim;
  auto deq = [](const kernels::WeightView& w) {
    std::vector<float> m(w.rows * w.cols);
    const int64_t rb = RowBytes(w.dtype, w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      kernels::DequantizeRow(w.dtype, static_cast<const uint8_t*>(w.data) + r * rb, &m[r * w.cols],
                             w.cols);
    }
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
  auto rmsnorm = [&](const float* x, const std::vector<float>& w, float* y) {
    double s = 0;
    for (int i = 0; i < c.dim; ++i) s += static_cast<double>(x[i]) * x[i];
    const double scale = 1.0 / std::sqrt(s / c.dim + c.rms_eps);
    for (int i = 0; i < c.dim; ++i) y[i] = static_cast<float>(x[i] * scale * w[i]);
  };
  auto rope = [&](float* v, int pos) {
    for (int i = 0; i < c.rope_dim / 2; ++i) {
      const double theta =
          pos * std::pow(static_cast<double>(c.rope_freq_base), -2.0 * i / c.rope_dim);
      const double a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = static_cast<float>(a * std::cos(theta) - b * std::sin(theta));
      v[2 * i + 1] = static_cast<float>(a * std::sin(theta) + b * std::cos(theta));
    }
  };
  const auto embd = deq(f.weights.token_embd);
  std::vector<float> x(n * c.dim);
  for (int t = 0; t < n; ++t) std::copy_n(&embd[tokens[t] * c.dim], c.dim, &x[t * c.dim]);
  std::vector<float> xn(c.dim), q(n * c.q_dim()), k(n * c.kv_dim()), v(n * c.kv_dim());
  std::vector<float> att(c.q_dim()), tmp(std::max(c.dim, c.ffn_dim)), g(c.ffn_dim), u(c.ffn_dim);
  for (const auto& L : f.weights.layers) {
    const auto wq = deq(L.wq), wk = deq(L.wk), wv = deq(L.wv), wo = deq(L.wo);
    const auto wg = deq(L.w_gate), wu = deq(L.w_up), wd = deq(L.w_down);
    for (int t = 0; t < n; ++t) {
      rmsnorm(&x[t * c.dim], L.attn_norm, xn.data());
      matvec(wq, c.q_dim(), c.dim, xn.data(), &q[t * c.q_dim()]);
      matvec(wk, c.kv_dim(), c.dim, xn.data(), &k[t * c.kv_dim()]);
      matvec(wv, c.kv_dim(), c.dim, xn.data(), &v[t * c.kv_dim()]);
      for (int h = 0; h < c.n_heads; ++h) rope(&q[t * c.q_dim() + h * hd], t);
      for (int h = 0; h < c.n_kv_heads; ++h) rope(&k[t * c.kv_dim() + h * hd], t);
      for (int i = 0; i < c.kv_dim(); ++i) {
        k[t * c.kv_dim() + i] = Fp16ToFp32(Fp32ToFp16(k[t * c.kv_dim() + i]));
        v[t * c.kv_dim() + i] = Fp16ToFp32(Fp32ToFp16(v[t * c.kv_dim() + i]));
      }
    }
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e)
            d += q[t * c.q_dim() + h * hd + e] * k[j * c.kv_dim() + kvh * hd + e];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int e = 0; e < hd; ++e) {
          double acc = 0;
          for (int j = 0; j <= t; ++j) acc += s[j] / sum * v[j * c.kv_dim() + kvh * hd + e];
          att[h * hd + e] = static_cast<float>(acc);
        }
      }
      matvec(wo, c.dim, c.q_dim(), att.data(), tmp.data());
      for (int i = 0; i < c.dim; ++i) x[t * c.dim + i] += tmp[i];
      rmsnorm(&x[t * c.dim], L.ffn_norm, xn.data());
      matvec(wg, c.ffn_dim, c.dim, xn.data(), g.data());
      matvec(wu, c.ffn_dim, c.dim, xn.data(), u.data());
      for (int i = 0; i < c.ffn_dim; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      matvec(wd, c.dim, c.ffn_dim, g.data(), tmp.data());
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

// With float weights the only approximations left are the fp16 KV cache (shared with the
// reference) and summation order: logits must agree closely at every position.
class TransformerBlockSizeTest : public ::testing::TestWithParam<int> {};

// Block size 8 exercises the portable attention, 16 the vector one (where the CPU has it).
TEST_P(TransformerBlockSizeTest, MatchesFloatReference) {
  testing::TinyLlamaSpec spec;
  spec.matrix_dtype = DType::kF32;
  spec.embd_dtype = DType::kF32;
  Fixture f(spec, /*threads=*/2, /*block_tokens=*/GetParam());
  const auto tokens = RandomTokens(21, spec.vocab, 3);
  const auto ref = ReferenceForward(f, tokens);
  // Feed the first 13 as one prefill chunk, then the rest one at a time (decode).
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 13);
  const std::vector<int32_t> extra(tokens.begin() + 13, tokens.end());
  const auto got = f.RunAlone(prompt, extra, Range(0, 4));
  const int V = spec.vocab;
  for (int step = 0; step <= static_cast<int>(extra.size()); ++step) {
    const int pos = 12 + step;
    for (int i = 0; i < V; ++i) {
      ASSERT_NEAR(got[step * V + i], ref[pos * V + i], 2e-3f) << "position " << pos << " id " << i;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(BlockTokens, TransformerBlockSizeTest, ::testing::Values(8, 16));

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
  testing::TinyLlamaSpec spec;
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
  ASSERT_TRUE(f.tf->Forward(first, *f.kv, &logits).ok());
  EXPECT_TRUE(logits.empty());
  BatchItem mixed[] = {
      {blocks_b, 6, {b.data() + 6, 4}, true},
      {blocks_a, static_cast<int>(a.size() - 1), {&a.back(), 1}, true},
      {blocks_c, 0, {c.data(), c.size()}, true},
  };
  ASSERT_TRUE(f.tf->Forward(mixed, *f.kv, &logits).ok());
  ASSERT_EQ(logits.size(), 3u * V);
  auto row = [&](int r) {
    return std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V);
  };
  EXPECT_EQ(MaxAbsDiff(row(0), alone_b), 0.0f);  // bit-identical: kernels are batch-invariant
  EXPECT_EQ(MaxAbsDiff(row(1), std::vector<float>(alone_a.end() - V, alone_a.end())), 0.0f);
  EXPECT_EQ(MaxAbsDiff(row(2), alone_c), 0.0f);
}

// Scattered, out-of-order blocks give the same result as contiguous ones, and chunked prefill
// equals whole prefill.
TEST(TransformerTest, ScatteredBlocksAndChunksEqualContiguous) {
  testing::TinyLlamaSpec spec;
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

// The attention kernel's vector path against the portable one, through a whole forward pass.
// Skipped where the CPU has no AVX-512 (both runs would take the portable path); the forced
// instruction set is restored however the test ends.
TEST(TransformerTest, AttentionIsaPathsAgree) {
  testing::TinyLlamaSpec spec;
  spec.dim = 128;  // head_dim 32; the vector path needs 16-token blocks
  Fixture f(spec, /*threads=*/2, /*block_tokens=*/16);
  const auto tokens = RandomTokens(40, spec.vocab, 31);
  std::vector<float> scalar;
  {
    kernels::ScopedIsa forced("scalar");
    ASSERT_TRUE(forced.ok());
    scalar = f.RunAlone(tokens, {}, Range(0, 5));
  }
  kernels::ScopedIsa forced("avx512");
  if (!forced.ok()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const auto vec = f.RunAlone(tokens, {}, Range(0, 5));
  EXPECT_LT(MaxAbsDiff(scalar, vec), 1e-4f);
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
