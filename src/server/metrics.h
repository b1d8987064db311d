// Request metrics of the HTTP front door and their Prometheus text exposition (format 0.0.4).
//
// Counters and histograms are updated from any thread (HTTP threads, the backend's loop thread
// in sinks); rendering takes a consistent-enough snapshot (each histogram under its own lock).
// Gauges come from serving::BackendStats at scrape time.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "http_door/door.h"
#include "serving/backend.h"

namespace tandem::server {

using tandem::Histogram;  // common/histogram.h

// Writes families in the Prometheus text format: "# HELP", "# TYPE", then samples.
class PrometheusWriter {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // A family with one sample per label set.
  void Family(const std::string& name, const std::string& type, const std::string& help,
              const std::vector<std::pair<Labels, double>>& samples);
  void Counter(const std::string& name, const std::string& help, double value);
  void Gauge(const std::string& name, const std::string& help, double value);
  void Histogram(const std::string& name, const std::string& help, const Histogram::Snapshot& s);
  const std::string& text() const { return out_; }

  static std::string FormatValue(double v);  // "3", "0.25", "+Inf", "NaN"
  static std::string EscapeLabel(const std::string& v);

 private:
  void Header(const std::string& name, const std::string& type, const std::string& help);
  std::string out_;
};

// How a request ended, as counted in tandem_requests_total{outcome=...}.
enum class Outcome { kSuccess, kLength, kCancelled, kError, kRejected, kTimeout, kBadRequest };
inline constexpr int kNumOutcomes = 7;
const char* OutcomeName(Outcome o);

class ServerMetrics {
 public:
  ServerMetrics();

  void CountOutcome(Outcome o) { outcomes_[static_cast<int>(o)].fetch_add(1); }
  // A request the backend finished: tokens, TTFT, TPOT, e2e latency and queue time.
  void RecordFinished(const serving::FinishInfo& info);

  int64_t outcome_count(Outcome o) const { return outcomes_[static_cast<int>(o)].load(); }
  int64_t generation_tokens() const { return generation_tokens_.load(); }

  // The whole /metrics body: the server's figures, the backend's and the front door's.
  std::string Render(const serving::BackendStats& stats,
                     const http_door::DoorStats& door = {}) const;

  // What the dashboard shows (server/dashboard.h): cumulative figures, histograms as snapshots.
  struct Snapshot {
    int64_t outcomes[kNumOutcomes] = {};
    int64_t prompt_tokens = 0;
    int64_t generation_tokens = 0;
    Histogram::Snapshot ttft, tpot, e2e, queue;
  };
  Snapshot Get() const;

 private:
  std::atomic<int64_t> outcomes_[kNumOutcomes] = {};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generation_tokens_{0};
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
  Histogram queue_;
  // Disaggregated requests: the parts of the time to first token after queueing.
  Histogram ttft_prefill_;
  Histogram ttft_transfer_;
  Histogram first_decode_;
};

}  // namespace tandem::server
