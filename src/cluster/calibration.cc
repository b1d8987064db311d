#include "cluster/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/logging.h"

namespace tandem::cluster {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Token ids for synthetic prompts: any valid ids do (costs do not depend on the values).
std::vector<int32_t> SyntheticTokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729 + 13) % vocab);
  return t;
}

// Computes tokens[from, to) of one sequence in chunks of `chunk`, as the serving loop would.
// Sliding layers' window storage is attached as it goes and kept (a point may be recomputed),
// which the short calibration sequences afford.
Status Prefill(engine::Engine& e, std::span<const int32_t> blocks, std::span<const int32_t> tokens,
               int from, int to, int chunk, std::vector<float>* logits) {
  for (int pos = from; pos < to;) {
    const int n = std::min(chunk, to - pos);
    TANDEM_RETURN_IF_ERROR(e.kv().AttachWindow(blocks, pos, pos + n));
    engine::BatchItem item{blocks, pos, tokens.subspan(pos, n), pos + n == to};
    TANDEM_RETURN_IF_ERROR(e.transformer().Forward(std::span(&item, 1), e.kv(), logits));
    pos += n;
  }
  return OkStatus();
}

std::string Sanitize(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return s;
}

// One round of timings of every point that fits the cache and the context: the prefill points
// into *prefill, the decode steps into *decode (each the fastest of its repeats).
Status MeasureOnce(engine::Engine& e, const CalibrationOptions& o, int context_limit,
                   std::vector<float>* logits_scratch,
                   std::vector<conductor::PrefillSample>* prefill_out,
                   std::vector<conductor::DecodeSample>* decode_out) {
  std::vector<float>& logits = *logits_scratch;
  auto& kv = e.kv();
  const int bt = kv.shape().block_tokens;
  const int vocab = e.config().vocab_size;
  const int chunk = std::max(1, o.max_batch_tokens);
  std::vector<conductor::PrefillSample>& prefill = *prefill_out;
  std::vector<conductor::DecodeSample>& decode = *decode_out;
  // Prefill: (new tokens, cached tokens) points, clipped to what the cache and context hold.
  // About 1,000 tokens computed in all, so that a small model calibrates in a few seconds.
  const std::pair<int, int> prefill_points[] = {{16, 0}, {96, 0}, {320, 0}, {64, 384}};
  int salt = 0;
  for (const auto& [n_new, n_cached] : prefill_points) {
    const int total = n_new + n_cached;
    if (total > context_limit) continue;
    auto blocks = kv.Allocate(kv.BlocksFor(total));
    if (!blocks.ok()) continue;
    const auto tokens = SyntheticTokens(total, vocab, ++salt);
    double best = 1e30;
    // The cached part once (untimed), then the new part `repeats` times over the same slots.
    Status st = Prefill(e, *blocks, tokens, 0, n_cached, chunk, &logits);
    for (int r = 0; r < std::max(1, o.repeats) && st.ok(); ++r) {
      const auto start = Clock::now();
      st = Prefill(e, *blocks, tokens, n_cached, total, chunk, &logits);
      best = std::min(best, SecondsSince(start));
    }
    kv.Release(*blocks);
    TANDEM_RETURN_IF_ERROR(st);
    prefill.push_back({n_new, n_cached, best});
  }

  // Decode steps: batch sizes x context per sequence. The KV contents do not matter for time.
  const std::pair<int, int> decode_points[] = {{1, 64}, {4, 64}, {16, 64}, {4, 1024}, {16, 512}};
  for (const auto& [batch, ctx] : decode_points) {
    if (ctx + 1 > context_limit || int64_t{batch} * kv.BlocksFor(ctx + 1) > kv.num_free()) continue;
    std::vector<std::vector<int32_t>> tables;
    bool ok = true;
    for (int b = 0; b < batch && ok; ++b) {
      auto blocks = kv.Allocate(kv.BlocksFor(ctx + 1));
      if (!blocks.ok())
        ok = false;
      else
        tables.push_back(std::move(*blocks));
    }
    std::vector<int32_t> next(batch);
    for (int b = 0; b < batch; ++b) next[b] = static_cast<int32_t>((b * 31 + 7) % vocab);
    std::vector<engine::BatchItem> items;
    for (int b = 0; ok && b < batch; ++b) {
      items.push_back({tables[b], ctx, std::span(next).subspan(b, 1), true});
      // The window a step at ctx reads (its contents do not matter for time); a point whose
      // windows do not fit the arena is skipped like one whose blocks do not fit the cache.
      ok = kv.AttachWindow(tables[b], int64_t{kv.WindowStartBlock(ctx)} * bt, ctx + 1).ok();
    }
    double best = 1e30;
    Status st;
    for (int r = 0; ok && r < std::max(2, o.repeats + 1) && st.ok(); ++r) {
      const auto start = Clock::now();
      st = e.transformer().Forward(items, kv, &logits);
      if (r > 0) best = std::min(best, SecondsSince(start));  // the first run warms caches
    }
    for (auto& t : tables) kv.Release(t);
    TANDEM_RETURN_IF_ERROR(st);
    if (ok) decode.push_back({batch, int64_t{batch} * (ctx + 1), best});
  }
  return OkStatus();
}

// Keeps the faster of two timings of the same point (a round disturbed by other work on the
// machine loses to one that was not).
template <typename Sample>
void KeepFastest(std::vector<Sample>* best, std::vector<Sample> round) {
  if (best->size() != round.size()) {
    *best = std::move(round);
    return;
  }
  for (size_t i = 0; i < round.size(); ++i) {
    (*best)[i].seconds = std::min((*best)[i].seconds, round[i].seconds);
  }
}

}  // namespace

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(' '));
        return name;
      }
    }
  }
  return "unknown";
}

StatusOr<conductor::CostModel> Calibrate(engine::Engine& e, const CalibrationOptions& o) {
  auto& kv = e.kv();
  const int bt = kv.shape().block_tokens;
  const int vocab = e.config().vocab_size;
  const int chunk = std::max(1, o.max_batch_tokens);
  const int64_t capacity = int64_t{kv.num_free()} * bt;
  const int context_limit = std::min<int64_t>(e.config().context_length - 1, capacity);
  std::vector<float> logits;
  {
    // Warm-up (page in the weights, grow the scratch buffers): not measured.
    auto blocks = kv.Allocate(kv.BlocksFor(64));
    if (blocks.ok()) {
      const auto tokens = SyntheticTokens(64, vocab, 0);
      TANDEM_RETURN_IF_ERROR(Prefill(e, *blocks, tokens, 0, 64, chunk, &logits));
      kv.Release(*blocks);
    }
  }

  // A fit fails when noise (other work on the machine) makes a larger point look cheaper than a
  // smaller one; each further round keeps the fastest timing of every point.
  constexpr int kRounds = 3;
  std::vector<conductor::PrefillSample> prefill;
  std::vector<conductor::DecodeSample> decode;
  StatusOr<conductor::CostModel> fitted = InvalidArgument("not measured");
  for (int round = 0; round < kRounds && !fitted.ok(); ++round) {
    std::vector<conductor::PrefillSample> p;
    std::vector<conductor::DecodeSample> d;
    TANDEM_RETURN_IF_ERROR(MeasureOnce(e, o, context_limit, &logits, &p, &d));
    KeepFastest(&prefill, std::move(p));
    KeepFastest(&decode, std::move(d));
    fitted = conductor::FitCostModel(prefill, decode);
  }
  if (!fitted.ok()) {
    return fitted.status().WithContext("after " + std::to_string(kRounds) + " rounds of timings");
  }
  conductor::CostModel m = std::move(*fitted);
  m.threads = e.options().threads;
  m.model = std::filesystem::path(e.options().model_path).filename().string();
  m.cpu = CpuModelName();
  m.source = "calibrated";
  return m;
}

std::string DefaultProfilePath(const engine::Engine& e, const CalibrationOptions& o) {
  std::filesystem::path dir;
  if (const char* d = std::getenv("TANDEM_PROFILE_DIR"); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::filesystem::path(x) / "tandem" / "profiles";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = std::filesystem::path(h) / ".cache" / "tandem" / "profiles";
  } else {
    return "";
  }
  const std::string name = std::filesystem::path(e.options().model_path).stem().string() + "-" +
                           std::to_string(e.model_bytes()) + "-t" +
                           std::to_string(e.options().threads) + "-b" +
                           std::to_string(o.max_batch_tokens) + "-k" +
                           std::to_string(e.options().block_tokens) + "-" + CpuModelName();
  return (dir / (Sanitize(name) + ".json")).string();
}

Status WriteProfile(const conductor::CostModel& m, const std::string& path) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // Written aside and renamed: a concurrent reader never sees half a file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Unavailable("cannot write the cost profile " + tmp);
    out << m.ToJson() << "\n";
    if (!out) return Unavailable("cannot write the cost profile " + tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Unavailable("cannot rename the cost profile to " + path + ": " + ec.message());
  return OkStatus();
}

StatusOr<conductor::CostModel> ReadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("no cost profile at " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto m = conductor::CostModel::FromJson(text.str());
  if (!m.ok()) return m.status().WithContext(path);
  if (!m->valid())
    return InvalidArgument(path + ": the cost profile has no prefill or decode cost");
  return m;
}

StatusOr<conductor::CostModel> LoadOrCalibrate(engine::Engine& e, const std::string& spec,
                                               const CalibrationOptions& o) {
  auto log = GetLogger("worker");
  if (spec == "none") return conductor::CostModel{};
  if (spec != "auto" && spec != "calibrate") {
    TANDEM_ASSIGN_OR_RETURN(conductor::CostModel m, ReadProfile(spec));
    m.source = "file:" + spec;
    return m;
  }
  const std::string path = DefaultProfilePath(e, o);
  if (spec == "auto" && !path.empty()) {
    auto m = ReadProfile(path);
    if (m.ok()) {
      m->source = "file:" + path;
      return m;
    }
    if (m.status().code() != StatusCode::kNotFound) {
      log->warn("ignoring the saved cost profile: {}", m.status().ToString());
    }
  }
  const auto start = Clock::now();
  TANDEM_ASSIGN_OR_RETURN(conductor::CostModel m, Calibrate(e, o));
  log->info(
      "calibrated the cost model in {:.1f} s: prefill {:.3f} ms + {:.4f} ms/token, decode "
      "step {:.2f} ms + {:.3f} ms/seq",
      SecondsSince(start), m.prefill_base_s * 1e3, m.prefill_per_token_s * 1e3,
      m.decode_base_s * 1e3, m.decode_per_seq_s * 1e3);
  if (!path.empty()) {
    if (Status st = WriteProfile(m, path); !st.ok()) log->warn("{}", st.ToString());
  }
  return m;
}

}  // namespace tandem::cluster
