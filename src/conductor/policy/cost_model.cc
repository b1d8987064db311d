#include "conductor/policy/cost_model.h"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/json_numbers.h"

namespace tandem::conductor {
namespace {

using nlohmann::json;

// Solves min |A x - y|^2 over x >= 0 for 3 unknowns by normal equations over the active set:
// a coefficient that comes out negative is fixed at 0 and the others refitted.
std::array<double, 3> NonNegativeLeastSquares(const std::vector<std::array<double, 3>>& rows,
                                              const std::vector<double>& y) {
  std::array<bool, 3> active = {true, true, true};
  std::array<double, 3> x = {0, 0, 0};
  for (int round = 0; round < 3; ++round) {
    std::vector<int> idx;
    for (int j = 0; j < 3; ++j) {
      if (active[j]) idx.push_back(j);
    }
    const int k = static_cast<int>(idx.size());
    if (k == 0) break;
    // Normal equations (A^T A) x = A^T y on the active columns, solved by Gaussian elimination
    // with partial pivoting. Columns are scaled to unit norm first (their units differ by 1e6).
    std::vector<double> scale(k, 0);
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int a = 0; a < k; ++a) scale[a] += rows[r][idx[a]] * rows[r][idx[a]];
    }
    for (int a = 0; a < k; ++a) scale[a] = scale[a] > 0 ? 1.0 / std::sqrt(scale[a]) : 0;
    std::vector<std::vector<double>> m(k, std::vector<double>(k + 1, 0));
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int a = 0; a < k; ++a) {
        const double va = rows[r][idx[a]] * scale[a];
        for (int b = 0; b < k; ++b) m[a][b] += va * rows[r][idx[b]] * scale[b];
        m[a][k] += va * y[r];
      }
    }
    for (int c = 0; c < k; ++c) {
      int pivot = c;
      for (int r = c + 1; r < k; ++r) {
        if (std::fabs(m[r][c]) > std::fabs(m[pivot][c])) pivot = r;
      }
      std::swap(m[c], m[pivot]);
      if (std::fabs(m[c][c]) < 1e-12) continue;
      for (int r = 0; r < k; ++r) {
        if (r == c) continue;
        const double f = m[r][c] / m[c][c];
        for (int cc = c; cc <= k; ++cc) m[r][cc] -= f * m[c][cc];
      }
    }
    x = {0, 0, 0};
    bool negative = false;
    for (int a = 0; a < k; ++a) {
      const double v = std::fabs(m[a][a]) < 1e-12 ? 0 : m[a][k] / m[a][a] * scale[a];
      x[idx[a]] = v;
      if (v < 0) negative = true;
    }
    if (!negative) return x;
    // Drop the most negative coefficient and refit.
    int worst = -1;
    for (int j = 0; j < 3; ++j) {
      if (active[j] && x[j] < 0 && (worst < 0 || x[j] < x[worst])) worst = j;
    }
    active[worst] = false;
  }
  for (double& v : x) v = std::max(0.0, v);
  return x;
}

}  // namespace

CostModel CostModel::Scaled(double prefill_factor, double decode_factor) const {
  CostModel c = *this;
  c.prefill_base_s *= prefill_factor;
  c.prefill_per_token_s *= prefill_factor;
  c.prefill_attention_s *= prefill_factor;
  c.decode_base_s *= decode_factor;
  c.decode_per_seq_s *= decode_factor;
  c.decode_per_context_token_s *= decode_factor;
  return c;
}

double CostModel::PrefillSeconds(int64_t new_tokens, int64_t cached_tokens) const {
  if (new_tokens <= 0) return 0;
  const double n = static_cast<double>(new_tokens);
  const double c = static_cast<double>(std::max<int64_t>(0, cached_tokens));
  return prefill_base_s + prefill_per_token_s * n + prefill_attention_s * n * (c + n / 2);
}

double CostModel::DecodeStepSeconds(int64_t batch, int64_t context_tokens) const {
  if (batch <= 0) return 0;
  return decode_base_s + decode_per_seq_s * static_cast<double>(batch) +
         decode_per_context_token_s * static_cast<double>(std::max<int64_t>(0, context_tokens));
}

double CostModel::MixedStepSeconds(int64_t batch, int64_t context_tokens,
                                   std::span<const Chunk> chunks) const {
  double linear = 0, attention = 0;
  for (const Chunk& ch : chunks) {
    if (ch.new_tokens <= 0) continue;
    const double n = static_cast<double>(ch.new_tokens);
    const double c = static_cast<double>(std::max<int64_t>(0, ch.cached_tokens));
    linear += prefill_per_token_s * n;
    attention += prefill_attention_s * n * (c + n / 2);
  }
  if (batch <= 0) return linear > 0 ? prefill_base_s + linear + attention : 0;
  return DecodeStepSeconds(batch, context_tokens) - decode_base_s +
         std::max(decode_base_s, linear) + attention;
}

std::string CostModel::ToJson() const {
  return json{{"prefill_base_s", prefill_base_s},
              {"prefill_per_token_s", prefill_per_token_s},
              {"prefill_attention_s", prefill_attention_s},
              {"decode_base_s", decode_base_s},
              {"decode_per_seq_s", decode_per_seq_s},
              {"decode_per_context_token_s", decode_per_context_token_s},
              {"model", model},
              {"threads", threads},
              {"cpu", cpu},
              {"source", source}}
      .dump();
}

StatusOr<CostModel> CostModel::FromJson(const std::string& text) {
  CostModel m;
  try {
    const json j = json::parse(text);
    if (!j.is_object()) return InvalidArgument("a cost profile must be a JSON object");
    if (!JsonFloatsBounded(j)) return InvalidArgument("cost profile: a number is out of range");
    auto number = [&](const char* key, double* out) -> Status {
      if (!j.contains(key))
        return InvalidArgument(std::string("cost profile: '") + key + "' is missing");
      const json& v = j.at(key);
      if (!v.is_number())
        return InvalidArgument(std::string("cost profile: '") + key + "' must be a number");
      *out = v.get<double>();
      if (!std::isfinite(*out) || *out < 0) {
        return InvalidArgument(std::string("cost profile: '") + key + "' must be finite and >= 0");
      }
      return OkStatus();
    };
    TANDEM_RETURN_IF_ERROR(number("prefill_base_s", &m.prefill_base_s));
    TANDEM_RETURN_IF_ERROR(number("prefill_per_token_s", &m.prefill_per_token_s));
    TANDEM_RETURN_IF_ERROR(number("prefill_attention_s", &m.prefill_attention_s));
    TANDEM_RETURN_IF_ERROR(number("decode_base_s", &m.decode_base_s));
    TANDEM_RETURN_IF_ERROR(number("decode_per_seq_s", &m.decode_per_seq_s));
    TANDEM_RETURN_IF_ERROR(number("decode_per_context_token_s", &m.decode_per_context_token_s));
    m.model = j.value("model", "");
    m.threads = j.value("threads", 0);
    m.cpu = j.value("cpu", "");
    m.source = j.value("source", "");
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("cost profile: ") + e.what());
  }
  return m;
}

StatusOr<CostModel> FitCostModel(std::span<const PrefillSample> prefill,
                                 std::span<const DecodeSample> decode) {
  if (prefill.size() < 3 || decode.size() < 3) {
    return InvalidArgument("a cost model needs at least 3 prefill and 3 decode samples");
  }
  std::vector<std::array<double, 3>> rows;
  std::vector<double> y;
  for (const auto& s : prefill) {
    const double n = static_cast<double>(s.new_tokens);
    rows.push_back({1.0, n, n * (static_cast<double>(s.cached_tokens) + n / 2)});
    y.push_back(s.seconds);
  }
  const auto p = NonNegativeLeastSquares(rows, y);
  rows.clear();
  y.clear();
  for (const auto& s : decode) {
    rows.push_back({1.0, static_cast<double>(s.batch), static_cast<double>(s.context_tokens)});
    y.push_back(s.seconds);
  }
  const auto d = NonNegativeLeastSquares(rows, y);
  CostModel m;
  m.prefill_base_s = p[0];
  m.prefill_per_token_s = p[1];
  m.prefill_attention_s = p[2];
  m.decode_base_s = d[0];
  m.decode_per_seq_s = d[1];
  m.decode_per_context_token_s = d[2];
  if (!m.valid()) {
    return InvalidArgument(
        "the samples do not fit a cost model (no per-token prefill cost or "
        "no decode step cost)");
  }
  return m;
}

}  // namespace tandem::conductor
