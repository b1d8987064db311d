// AttendTile on every instruction set the CPU has, against a float64 reference with error bounds
// derived from each path's roundings, on paged blocks whose unseen positions hold values that
// would show any masking mistake (large values before the window, NaN past the last position).
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu_isa.h"

namespace tandem::kernels {
namespace {

constexpr int kBlock = 16;

struct Shape {
  int head_dim;
  int group;
  int window;     // 0: causal only
  int first_pos;  // of the tile
  int n_tokens;
};

// Paged K/V of one KV head for positions [0, first_pos + n_tokens), plus the queries of a tile.
class Case {
 public:
  explicit Case(const Shape& s, uint32_t seed) : s_(s) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int len = s.first_pos + s.n_tokens;
    const int n_blocks = (len + kBlock - 1) / kBlock;
    AttentionTile probe{};
    probe.block_tokens = kBlock;
    probe.window = s.window;
    const int first_seen = WindowStart(probe, s.first_pos);  // no query sees positions before it
    const uint16_t nan16 = Fp32ToFp16(std::numeric_limits<float>::quiet_NaN());
    keys_.assign(n_blocks, std::vector<uint16_t>(static_cast<size_t>(s.head_dim) * kBlock));
    values_.assign(n_blocks, std::vector<uint16_t>(static_cast<size_t>(kBlock) * s.head_dim));
    for (int b = 0; b < n_blocks; ++b) {
      for (int j = 0; j < kBlock; ++j) {
        const int pos = b * kBlock + j;
        for (int d = 0; d < s.head_dim; ++d) {
          uint16_t k = Fp32ToFp16(u(rng)), v = Fp32ToFp16(u(rng));
          if (pos >= len) k = v = nan16;                           // never written
          if (pos < first_seen) v = Fp32ToFp16(1000.0f + u(rng));  // out of every window
          keys_[b][d * kBlock + j] = k;
          values_[b][j * s.head_dim + d] = v;
        }
      }
      // Blocks wholly before the first window are never read (the engine may have freed them).
      const bool freed = (b + 1) * kBlock <= first_seen;
      key_ptrs_.push_back(freed ? nullptr : keys_[b].data());
      value_ptrs_.push_back(freed ? nullptr : values_[b].data());
    }
    q_.resize(static_cast<size_t>(s.n_tokens) * s.group * s.head_dim);
    for (float& x : q_) x = u(rng);
  }

  AttentionTile Tile() const {
    AttentionTile t{};
    t.keys = key_ptrs_.data();
    t.values = value_ptrs_.data();
    t.head_dim = s_.head_dim;
    t.block_tokens = kBlock;
    t.group = s_.group;
    t.scale = 1.0f / std::sqrt(static_cast<float>(s_.head_dim));
    t.window = s_.window;
    return t;
  }

  // Tokens [t0, t0 + n) of the tile through AttendTile, into out (n_tokens, group, head_dim).
  void Run(int t0, int n, std::vector<float>& out) const {
    const int64_t stride = static_cast<int64_t>(s_.group) * s_.head_dim;
    out.resize(static_cast<size_t>(s_.n_tokens) * stride);
    AttendTile(Tile(), s_.first_pos + t0, n, q_.data() + t0 * stride, stride,
               out.data() + t0 * stride, stride);
  }

  // The whole tile through key ranges of `chunk` positions (a multiple of kAttentionChunkAlign),
  // each a partial call, folded in position order and normalized, as the engine runs a long
  // context. Returns the number of ranges.
  int RunChunked(int chunk, std::vector<float>& out) const {
    const int g = s_.group, hd = s_.head_dim, rows = s_.n_tokens * g;
    const int64_t stride = static_cast<int64_t>(g) * hd;
    out.assign(static_cast<size_t>(s_.n_tokens) * stride, 0.0f);
    std::vector<float> acc(static_cast<size_t>(rows) * hd), run_acc(acc.size(), 0.0f);
    std::vector<AttentionRowState> st(rows), run_st(rows, AttentionRowState{-INFINITY, 0.0f});
    AttentionTile a = Tile();
    a.partial = st.data();
    const int last = s_.first_pos + s_.n_tokens - 1;
    int ranges = 0;
    for (int begin = WindowStart(a, s_.first_pos) / chunk * chunk; begin <= last; begin += chunk) {
      a.key_begin = begin;
      a.key_end = begin + chunk;
      AttendTile(a, s_.first_pos, s_.n_tokens, q_.data(), stride, acc.data(), stride);
      FoldAttentionPartial(rows, hd, acc.data(), st.data(), run_acc.data(), run_st.data());
      ++ranges;
    }
    NormalizeAttentionRows(rows, g, hd, run_acc.data(), run_st.data(), out.data(), stride);
    return ranges;
  }

  // Largest |error| allowed for token t, head gi, when q, k, v and the softmax weights are first
  // rounded with unit roundoff u_in (0: used as given) and sums run in fp32:
  //   a score moves by at most D = scale * (2 u_in + head_dim * u32) * max_j sum_d |q_d k_jd|;
  //   a weight p_j / sum p then by a factor within exp(+-2D) (1 +- u_in)^2, and the values by
  //   u_in; so |out - ref| <= max_j |v_j| * (3 u_in + 2 D + (ctx + 1) u32 + exp's 1e-6),
  // to first order, with ctx the number of positions summed. Also returns the reference.
  double Reference(int t, int gi, std::vector<double>& ref, double u_in) const {
    const AttentionTile a = Tile();
    const int hd = s_.head_dim, pos = s_.first_pos + t;
    const float* q = q_.data() + (static_cast<int64_t>(t) * s_.group + gi) * hd;
    const int j0 = WindowStart(a, pos);
    std::vector<double> score;
    double max_abs_dot = 0, max_abs_v = 0, m = -INFINITY;
    for (int j = j0; j <= pos; ++j) {
      double dot = 0, abs_dot = 0;
      for (int d = 0; d < hd; ++d) {
        const double p = static_cast<double>(q[d]) * K(j, d);
        dot += p;
        abs_dot += std::fabs(p);
      }
      score.push_back(dot * a.scale);
      m = std::max(m, score.back());
      max_abs_dot = std::max(max_abs_dot, abs_dot);
      for (int d = 0; d < hd; ++d) max_abs_v = std::max(max_abs_v, std::fabs(V(j, d)));
    }
    double sum = 0;
    for (double& x : score) sum += (x = std::exp(x - m));
    ref.assign(hd, 0.0);
    for (int j = j0; j <= pos; ++j) {
      for (int d = 0; d < hd; ++d) ref[d] += score[j - j0] / sum * V(j, d);
    }
    const double u32 = std::ldexp(1.0, -24);
    const double ctx = pos - j0 + 1;
    const double dscore = a.scale * (2 * u_in + hd * u32) * max_abs_dot;
    return max_abs_v * (3 * u_in + 2 * dscore + (ctx + 1) * u32 + 1e-6);
  }

 private:
  double K(int pos, int d) const {
    return Fp16ToFp32(keys_[pos / kBlock][d * kBlock + pos % kBlock]);
  }
  double V(int pos, int d) const {
    return Fp16ToFp32(values_[pos / kBlock][(pos % kBlock) * s_.head_dim + d]);
  }

  Shape s_;
  std::vector<std::vector<uint16_t>> keys_, values_;
  std::vector<const uint16_t*> key_ptrs_, value_ptrs_;
  std::vector<float> q_;
};

std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (const auto& [hd, group] : {std::pair{64, 3}, std::pair{256, 4}, std::pair{48, 2}}) {
    for (int window : {0, 20}) {
      for (int first_pos : {0, 5, 37}) {
        for (int n : {1, 7, kMaxAttentionTile}) shapes.push_back({hd, group, window, first_pos, n});
      }
    }
  }
  return shapes;
}

std::vector<std::string> AvailableIsas() {
  std::vector<std::string> isas;
  for (const char* isa : {"scalar", "avx2", "avx512", "amx"}) {
    ScopedIsa probe(isa);
    if (probe.ok()) isas.push_back(isa);
  }
  return isas;
}

TEST(AttentionTest, EveryPathStaysWithinItsDerivedBoundOfAFloat64Reference) {
  for (const std::string& isa : AvailableIsas()) {
    SCOPED_TRACE(isa);
    ScopedIsa forced(isa.c_str());
    // Only the bf16 path rounds its inputs (8 significant bits: unit roundoff 2^-8).
    const double u_in = isa == "amx" ? std::ldexp(1.0, -8) : 0.0;
    uint32_t seed = 1;
    for (const Shape& s : Shapes()) {
      SCOPED_TRACE(testing::Message() << "head_dim " << s.head_dim << " window " << s.window
                                      << " first_pos " << s.first_pos << " n " << s.n_tokens);
      const Case c(s, seed++);
      std::vector<float> out;
      c.Run(0, s.n_tokens, out);
      std::vector<double> ref;
      double worst = 0;  // largest error as a share of its bound
      for (int t = 0; t < s.n_tokens; ++t) {
        for (int gi = 0; gi < s.group; ++gi) {
          const double bound = c.Reference(t, gi, ref, u_in);
          const float* o = out.data() + (static_cast<int64_t>(t) * s.group + gi) * s.head_dim;
          for (int d = 0; d < s.head_dim; ++d) {
            ASSERT_TRUE(std::isfinite(o[d])) << "token " << t << " head " << gi << " dim " << d;
            worst = std::max(worst, std::fabs(o[d] - ref[d]) / bound);
          }
        }
      }
      EXPECT_LE(worst, 1.0);
    }
  }
}

// A row's result does not depend on which rows share its call: the whole tile at once, and one
// token per call, are bit-identical on every path (the engine's batch invariance rests on it).
TEST(AttentionTest, ARowsResultDoesNotDependOnItsTile) {
  for (const std::string& isa : AvailableIsas()) {
    SCOPED_TRACE(isa);
    ScopedIsa forced(isa.c_str());
    uint32_t seed = 100;
    for (const Shape& s : Shapes()) {
      if (s.n_tokens == 1) continue;
      SCOPED_TRACE(testing::Message() << "head_dim " << s.head_dim << " window " << s.window
                                      << " first_pos " << s.first_pos << " n " << s.n_tokens);
      const Case c(s, seed++);
      std::vector<float> whole, single;
      c.Run(0, s.n_tokens, whole);
      for (int t = 0; t < s.n_tokens; ++t) c.Run(t, 1, single);
      ASSERT_EQ(whole.size(), single.size());
      for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(whole[i], single[i]) << "element " << i;
    }
  }
}

// Key ranges (how the engine spreads one long context over threads): folded in order they stay
// within the same derived bound, and a row whose keys all lie in one range gets exactly the
// output of a call without ranges, on every path.
TEST(AttentionTest, KeyRangesFoldToTheSameResult) {
  constexpr int kChunk = 32;
  for (const std::string& isa : AvailableIsas()) {
    SCOPED_TRACE(isa);
    ScopedIsa forced(isa.c_str());
    const double u_in = isa == "amx" ? std::ldexp(1.0, -8) : 0.0;
    uint32_t seed = 200;
    for (const auto& [hd, group] : {std::pair{64, 3}, std::pair{256, 4}}) {
      for (int window : {0, 20}) {
        for (const auto& [first_pos, n] :
             {std::pair{0, 7}, std::pair{37, 64}, std::pair{100, 1}, std::pair{150, 9}}) {
          const Shape s{hd, group, window, first_pos, n};
          SCOPED_TRACE(testing::Message() << "head_dim " << hd << " window " << window
                                          << " first_pos " << first_pos << " n " << n);
          const Case c(s, seed++);
          std::vector<float> whole, chunked;
          c.Run(0, n, whole);
          ASSERT_GE(c.RunChunked(kChunk, chunked), 1);
          std::vector<double> ref;
          double worst = 0;
          for (int t = 0; t < n; ++t) {
            const int pos = first_pos + t;
            AttentionTile probe{};
            probe.window = window;
            const bool one_range = WindowStart(probe, pos) / kChunk == pos / kChunk;
            for (int gi = 0; gi < group; ++gi) {
              const int64_t off = (static_cast<int64_t>(t) * group + gi) * hd;
              // The fold adds per range one rounded exp and a multiply-add per element (~3 u32
              // relative), under the bound's (ctx + 1) u32 summation term (ranges <= ctx / 32).
              const double bound = c.Reference(t, gi, ref, u_in);
              for (int d = 0; d < hd; ++d) {
                worst = std::max(worst, std::fabs(chunked[off + d] - ref[d]) / bound);
                if (one_range) {
                  ASSERT_EQ(chunked[off + d], whole[off + d]) << "token " << t << " dim " << d;
                }
              }
            }
          }
          EXPECT_LE(worst, 1.0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
