// Engine throughput on one model: prefill tokens/s at several prompt lengths, decode tokens/s
// at several batch sizes, peak RSS, and the machine's measured limits (memory read bandwidth,
// fp32 FMA peak) for ratios. Prints one JSON object per line on stdout.
//
//   build/bench/engine_bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 1,2
#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "common/process_memory.h"
#include "engine/engine.h"
#include "kernels/cpu_isa.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::engine::BatchItem;
using tandem::engine::Engine;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Deterministic prompt tokens (ids spread over the vocabulary, avoiding control tokens).
std::vector<int32_t> PromptTokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i)
    t[i] = 100 + static_cast<int32_t>((i * 7919L + salt * 104729L) % (vocab - 100));
  return t;
}

// Sums doubles [b, e) with eight independent vector accumulators, so that the loads, not the
// adds, are the limit (a scalar or single-chain sum measures add latency instead).
__attribute__((target("avx2"))) double SumAvx2(const double* p, int64_t b, int64_t e) {
  __m256d acc[8];
  for (auto& a : acc) a = _mm256_setzero_pd();
  int64_t i = b;
  for (; i + 32 <= e; i += 32) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_pd(acc[j], _mm256_loadu_pd(p + i + 4 * j));
  }
  double s = 0;
  for (int j = 0; j < 8; ++j) {
    alignas(32) double t[4];
    _mm256_store_pd(t, acc[j]);
    s += t[0] + t[1] + t[2] + t[3];
  }
  for (; i < e; ++i) s += p[i];
  return s;
}

// Read bandwidth in GB/s of `bytes` of memory summed `threads` ways, the best of several passes
// after a warm-up pass: a buffer far larger than the caches gives DRAM bandwidth; one the size of
// the model's weights gives what a decode step's weight stream can get at best on this machine,
// from whichever cache level holds that working set (L3 holds a small model on large-cache CPUs).
double MeasureReadBandwidth(tandem::ThreadPool& pool, size_t bytes) {
  const size_t n = bytes / sizeof(double);
  std::vector<double> buf(n, 1.0);
  std::vector<double> sums(pool.num_threads());
  const int passes = static_cast<int>(std::clamp<size_t>((size_t{4} << 30) / bytes, 4, 40));
  double best = 1e30;
  for (int rep = 0; rep <= passes; ++rep) {
    const auto t0 = Clock::now();
    pool.ParallelFor(
        static_cast<int64_t>(n),
        [&](int64_t b, int64_t e, int t) { sums[t] += SumAvx2(buf.data(), b, e); }, 4096);
    if (rep > 0) best = std::min(best, Since(t0));
  }
  return static_cast<double>(n) * sizeof(double) / best / 1e9;
}

// Peak fp32 FLOP/s with independent FMA chains (AVX-512 if present, else AVX2).
__attribute__((target("avx512f,fma"))) double FmaLoop512(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]);
  return s;
}
__attribute__((target("avx2,fma"))) double FmaLoop256(int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  float out[8], s = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(out, a[i]);
    for (float x : out) s += x;
  }
  return s;
}

// Peak int8 dot-product throughput (what prefill's quantized matmuls run on): independent
// vpdpbusd chains, 64 multiply-adds (128 ops) per instruction. 0 without AVX-512 VNNI.
__attribute__((target("avx512f,avx512vnni"))) double VnniLoop(int64_t iters) {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
  int64_t sum = 0;
  for (int i = 0; i < 12; ++i) sum += _mm512_reduce_add_epi32(a[i]);
  return static_cast<double>(sum);
}

double MeasurePeakInt8Ops(tandem::ThreadPool& pool) {
  if (!tandem::kernels::DetectedCpuFeatures().avx512) return 0;
  const int64_t iters = 20'000'000;
  std::vector<double> best;
  double sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    pool.RunOnAll([&](int) { sink += VnniLoop(iters); });
    best.push_back(Since(t0));
  }
  if (sink == 12345.678) std::puts("");
  return 12.0 * 128 * iters * pool.num_threads() / *std::min_element(best.begin(), best.end());
}

double MeasurePeakFlops(tandem::ThreadPool& pool) {
  const bool avx512 = tandem::kernels::DetectedCpuFeatures().avx512;
  const int64_t iters = 20'000'000;
  const double flops_per_iter = 12.0 * (avx512 ? 16 : 8) * 2;
  std::vector<double> best;
  double sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    pool.RunOnAll([&](int) { sink += avx512 ? FmaLoop512(iters) : FmaLoop256(iters); });
    best.push_back(Since(t0));
  }
  if (sink == 12345.678) std::puts("");
  return flops_per_iter * iters * pool.num_threads() / *std::min_element(best.begin(), best.end());
}

void Emit(nlohmann::json j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem engine benchmark"};
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<int> threads = {1, 2}, prompt_lens = {128, 512, 2048}, batches = {1, 8, 32};
  int decode_steps = 32, repeats = 3, decode_context = 128;
  bool limits = true;
  std::string isa = "auto";
  app.add_option("--model", model);
  app.add_option("--isa", isa,
                 "Kernel instruction set: auto (the best the CPU has), scalar, avx2, avx512, "
                 "amx");
  app.add_option("--threads", threads)->delimiter(',');
  app.add_option("--prompt-lengths", prompt_lens)->delimiter(',');
  app.add_option("--batches", batches)->delimiter(',');
  app.add_option("--decode-steps", decode_steps);
  app.add_option("--decode-context", decode_context,
                 "Prompt tokens in each sequence's cache before the timed decode steps");
  app.add_option("--repeats", repeats);
  app.add_flag("!--no-limits", limits, "Skip measuring bandwidth and peak FLOP/s");
  CLI11_PARSE(app, argc, argv);
  if (!tandem::kernels::ForceIsa(isa.c_str())) {
    std::fprintf(stderr, "error: this CPU cannot run the instruction set '%s'\n", isa.c_str());
    return 1;
  }

  for (int nt : threads) {
    tandem::engine::EngineOptions opts;
    opts.model_path = model;
    opts.threads = nt;
    opts.prefill_chunk = 4096;
    int max_batch = *std::max_element(batches.begin(), batches.end());
    int max_prompt = *std::max_element(prompt_lens.begin(), prompt_lens.end());
    opts.kv_capacity_tokens =
        std::max(max_prompt + 16, max_batch * (decode_context + decode_steps + 16));
    auto loaded = Engine::Load(opts);
    if (!loaded.ok()) {
      std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    Engine& eng = **loaded;
    const auto& cfg = eng.config();
    // Matrix parameters touched per token: every layer's, and the output head's (which a prompt
    // needs for its last token only), for operation counts.
    const double layer_params =
        static_cast<double>(cfg.n_layers) *
        (2.0 * cfg.dim * cfg.q_dim() + 2.0 * cfg.dim * cfg.kv_dim() + 3.0 * cfg.dim * cfg.ffn_dim);
    const double head_params = static_cast<double>(cfg.vocab_size) * cfg.dim;
    Emit({{"engine", "machine"},
          {"threads", nt},
          {"metric", "isa"},
          {"value", tandem::kernels::ActiveIsa()}});
    if (limits) {
      Emit({{"engine", "machine"},
            {"threads", nt},
            {"metric", "read_bandwidth_gbps"},
            {"value", MeasureReadBandwidth(eng.pool(), size_t{1} << 30)}});
      Emit({{"engine", "machine"},
            {"threads", nt},
            {"metric", "model_read_bandwidth_gbps"},
            {"value", MeasureReadBandwidth(eng.pool(), eng.model_bytes())}});
      Emit({{"engine", "machine"},
            {"threads", nt},
            {"metric", "peak_fp32_gflops"},
            {"value", MeasurePeakFlops(eng.pool()) / 1e9}});
      Emit({{"engine", "machine"},
            {"threads", nt},
            {"metric", "peak_int8_gops"},
            {"value", MeasurePeakInt8Ops(eng.pool()) / 1e9}});
    }
    // The peak below is the engine's at this thread count: not the limits' buffers (freed by
    // now), nor an earlier thread count's.
    tandem::ResetPeakResident();
    std::vector<float> logits;
    for (int len : prompt_lens) {
      std::vector<double> times;
      const auto tokens = PromptTokens(len, cfg.vocab_size, len);
      for (int r = 0; r < repeats + 1; ++r) {  // first run warms up
        auto blocks = eng.kv().Allocate(eng.kv().BlocksFor(len)).value();
        BatchItem item{blocks, 0, tokens, true};
        const auto t0 = Clock::now();
        auto st = eng.kv().AttachWindow(blocks, 0, len);  // sliding layers' KV storage
        if (st.ok()) st = eng.transformer().Forward({&item, 1}, eng.kv(), &logits);
        const double dt = Since(t0);
        eng.kv().Release(blocks);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          return 1;
        }
        if (r > 0) times.push_back(dt);
      }
      const double tps = len / Median(times);
      Emit({{"engine", "tandem"},
            {"threads", nt},
            {"metric", "prefill"},
            {"prompt_len", len},
            {"tokens_per_s", tps},
            // Quantized-matmul work per second (int8 dot products; attention not counted).
            {"matmul_gops", tps * 2 * (layer_params + head_params / len) / 1e9}});
    }
    for (int batch : batches) {
      const int prompt_len = decode_context;
      std::vector<std::vector<int32_t>> blocks(batch);
      std::vector<std::vector<int32_t>> prompts(batch);
      for (int b = 0; b < batch; ++b) {
        blocks[b] = eng.kv().Allocate(eng.kv().BlocksFor(prompt_len + decode_steps + 1)).value();
        prompts[b] = PromptTokens(prompt_len, cfg.vocab_size, 1000 + b);
        BatchItem item{blocks[b], 0, prompts[b], true};
        if (!eng.kv().AttachWindow(blocks[b], 0, prompt_len + decode_steps + 1).ok()) return 1;
        if (!eng.transformer().Forward({&item, 1}, eng.kv(), &logits).ok()) return 1;
      }
      std::vector<double> step_times;
      std::vector<int32_t> next(batch, 200);
      std::vector<BatchItem> items(batch);
      for (int s = 0; s < decode_steps; ++s) {
        for (int b = 0; b < batch; ++b) items[b] = {blocks[b], prompt_len + s, {&next[b], 1}, true};
        const auto t0 = Clock::now();
        if (!eng.transformer().Forward(items, eng.kv(), &logits).ok()) return 1;
        step_times.push_back(Since(t0));
        for (int b = 0; b < batch; ++b) next[b] = 200 + (s * 31 + b) % 1000;
      }
      for (auto& bl : blocks) eng.kv().Release(bl);
      const double step = Median(step_times);
      Emit({{"engine", "tandem"},
            {"threads", nt},
            {"metric", "decode"},
            {"batch", batch},
            {"prompt_len", prompt_len},
            {"tokens_per_s", batch / step},
            {"model_bytes", eng.model_bytes()},
            {"weight_gbps", eng.model_bytes() / step / 1e9}});
    }
    Emit({{"engine", "tandem"},
          {"threads", nt},
          {"metric", "peak_rss_mib"},
          {"value", tandem::ReadProcessMemory().peak_resident_bytes / 1048576.0}});
  }
  return 0;
}
