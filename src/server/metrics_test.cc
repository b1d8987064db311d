#include "server/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>

namespace tandem::server {
namespace {

TEST(MetricsTest, FormatValue) {
  EXPECT_EQ(PrometheusWriter::FormatValue(3), "3");
  EXPECT_EQ(PrometheusWriter::FormatValue(0), "0");
  EXPECT_EQ(PrometheusWriter::FormatValue(0.25), "0.25");
  EXPECT_EQ(PrometheusWriter::FormatValue(0.1), "0.1");
  EXPECT_EQ(PrometheusWriter::FormatValue(-2.5), "-2.5");
  EXPECT_EQ(PrometheusWriter::FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(PrometheusWriter::FormatValue(std::nan("")), "NaN");
}

TEST(MetricsTest, LabelEscaping) {
  EXPECT_EQ(PrometheusWriter::EscapeLabel("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  const auto s = h.Get();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.sum, 7.65);
  PrometheusWriter w;
  w.Histogram("x_seconds", "help", s);
  EXPECT_EQ(w.text(),
            "# HELP x_seconds help\n# TYPE x_seconds histogram\n"
            "x_seconds_bucket{le=\"0.1\"} 2\nx_seconds_bucket{le=\"1\"} 3\n"
            "x_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 7.65\nx_seconds_count 4\n");
}

// Parses the exposition: every line a comment (# HELP/# TYPE) or `name{labels} value`.
std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> samples;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*$)");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, comment)) continue;
    EXPECT_TRUE(std::regex_match(line, m, sample)) << "bad line: " << line;
    if (m.size() > 3) samples[m[1]] = m[3] == "+Inf" ? 1.0 / 0.0 : std::stod(m[3]);
  }
  return samples;
}

TEST(MetricsTest, ServerMetricsExposition) {
  ServerMetrics m;
  m.CountOutcome(Outcome::kBadRequest);
  m.CountOutcome(Outcome::kSuccess);
  serving::FinishInfo info;
  info.reason = serving::FinishReason::kStop;
  info.prompt_tokens = 10;
  info.completion_tokens = 5;
  info.ttft_seconds = 0.2;
  info.total_seconds = 0.6;
  info.queue_seconds = 0.01;
  m.RecordFinished(info);
  serving::BackendStats stats;
  stats.running = 2;
  stats.waiting = 3;
  stats.kv_blocks_total = 100;
  stats.kv_blocks_used = 40;
  stats.prefix_cache_hit_tokens = 64;
  const std::string text = m.Render(stats);
  EXPECT_EQ(text.back(), '\n');
  auto s = ParseExposition(text);
  EXPECT_EQ(s["tandem_requests_total{outcome=\"success\"}"], 1);
  EXPECT_EQ(s["tandem_requests_total{outcome=\"bad_request\"}"], 1);
  for (const char* o : {"length", "cancelled", "error", "rejected", "timeout"}) {
    EXPECT_EQ(s.count(std::string("tandem_requests_total{outcome=\"") + o + "\"}"), 1u) << o;
  }
  EXPECT_EQ(s["tandem_prompt_tokens_total"], 10);
  EXPECT_EQ(s["tandem_generation_tokens_total"], 5);
  EXPECT_EQ(s["tandem_prefix_cache_hit_tokens_total"], 64);
  EXPECT_EQ(s["tandem_requests_running"], 2);
  EXPECT_EQ(s["tandem_requests_waiting"], 3);
  EXPECT_EQ(s["tandem_kv_blocks_used"], 40);
  EXPECT_EQ(s["tandem_kv_blocks_free"], 60);
  EXPECT_EQ(s.count("tandem_kv_window_blocks_used"), 0u);  // no sliding-window layers
  stats.kv_window_blocks_total = 30;
  stats.kv_window_blocks_used = 12;
  auto windowed = ParseExposition(m.Render(stats));
  EXPECT_EQ(windowed["tandem_kv_window_blocks_used"], 12);
  EXPECT_EQ(windowed["tandem_kv_window_blocks_free"], 18);
  EXPECT_EQ(s.count("tandem_worker_threads{worker=\"colocated\",role=\"mixed\"}"), 0u);
  stats.engine_threads = 2;  // one engine: its utilisation, labelled as the conductor labels it
  stats.busy_seconds_prefill = 1.5;
  stats.busy_seconds_decode = 0.25;
  stats.computed_tokens_prefill = 900;
  stats.computed_tokens_decode = 40;
  auto engine = ParseExposition(m.Render(stats));
  const std::string labels = "worker=\"colocated\",role=\"mixed\"";
  EXPECT_EQ(engine["tandem_worker_threads{" + labels + "}"], 2);
  EXPECT_EQ(engine["tandem_worker_busy_seconds_total{" + labels + ",phase=\"prefill\"}"], 1.5);
  EXPECT_EQ(engine["tandem_worker_busy_seconds_total{" + labels + ",phase=\"decode\"}"], 0.25);
  EXPECT_EQ(engine["tandem_worker_computed_tokens_total{" + labels + ",phase=\"prefill\"}"], 900);
  EXPECT_EQ(engine["tandem_worker_computed_tokens_total{" + labels + ",phase=\"decode\"}"], 40);
  EXPECT_EQ(s["tandem_time_to_first_token_seconds_count"], 1);
  EXPECT_DOUBLE_EQ(s["tandem_time_to_first_token_seconds_sum"], 0.2);
  EXPECT_EQ(s["tandem_time_per_output_token_seconds_count"], 1);
  EXPECT_DOUBLE_EQ(s["tandem_time_per_output_token_seconds_sum"], 0.1);
  EXPECT_EQ(s["tandem_e2e_request_latency_seconds_bucket{le=\"+Inf\"}"], 1);
  EXPECT_EQ(s["tandem_queue_time_seconds_count"], 1);
  EXPECT_NE(text.find("# TYPE tandem_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE tandem_kv_blocks_used gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE tandem_e2e_request_latency_seconds histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace tandem::server
