#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/process_memory.h"

namespace tandem::server {

std::string PrometheusWriter::FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    // Prefer the shortest representation that round-trips.
    for (int prec = 1; prec <= 17; ++prec) {
      char shorter[64];
      std::snprintf(shorter, sizeof(shorter), "%.*g", prec, v);
      if (std::strtod(shorter, nullptr) == v) {
        std::snprintf(buf, sizeof(buf), "%s", shorter);
        break;
      }
    }
  }
  return buf;
}

std::string PrometheusWriter::EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusWriter::Header(const std::string& name, const std::string& type,
                              const std::string& help) {
  std::string h;
  for (char c : help) {
    if (c == '\\') {
      h += "\\\\";
    } else if (c == '\n') {
      h += "\\n";
    } else {
      h += c;
    }
  }
  out_ += "# HELP " + name + " " + h + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusWriter::Family(const std::string& name, const std::string& type,
                              const std::string& help,
                              const std::vector<std::pair<Labels, double>>& samples) {
  Header(name, type, help);
  for (const auto& [labels, value] : samples) {
    out_ += name;
    if (!labels.empty()) {
      out_ += "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) out_ += ",";
        out_ += labels[i].first + "=\"" + EscapeLabel(labels[i].second) + "\"";
      }
      out_ += "}";
    }
    out_ += " " + FormatValue(value) + "\n";
  }
}

void PrometheusWriter::Counter(const std::string& name, const std::string& help, double value) {
  Family(name, "counter", help, {{{}, value}});
}

void PrometheusWriter::Gauge(const std::string& name, const std::string& help, double value) {
  Family(name, "gauge", help, {{{}, value}});
}

void PrometheusWriter::Histogram(const std::string& name, const std::string& help,
                                 const Histogram::Snapshot& s) {
  Header(name, "histogram", help);
  for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
    out_ += name + "_bucket{le=\"" + FormatValue(s.upper_bounds[i]) + "\"} " +
            FormatValue(static_cast<double>(s.cumulative[i])) + "\n";
  }
  out_ += name + "_bucket{le=\"+Inf\"} " + FormatValue(static_cast<double>(s.count)) + "\n";
  out_ += name + "_sum " + FormatValue(s.sum) + "\n";
  out_ += name + "_count " + FormatValue(static_cast<double>(s.count)) + "\n";
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kSuccess: return "success";
    case Outcome::kLength: return "length";
    case Outcome::kCancelled: return "cancelled";
    case Outcome::kError: return "error";
    case Outcome::kRejected: return "rejected";
    case Outcome::kTimeout: return "timeout";
    case Outcome::kBadRequest: return "bad_request";
  }
  return "unknown";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
             1.0, 2.5}),
      e2e_({0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,  10.0,
            15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0}),
      queue_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
              10.0, 20.0, 40.0, 80.0}),
      ttft_prefill_({0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
                     40.0, 80.0}),
      ttft_transfer_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                      0.5, 1.0, 2.5}),
      first_decode_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5}) {}

void ServerMetrics::RecordFinished(const serving::FinishInfo& info) {
  prompt_tokens_.fetch_add(info.prompt_tokens);
  generation_tokens_.fetch_add(info.completion_tokens);
  e2e_.Observe(info.total_seconds);
  queue_.Observe(info.queue_seconds);
  if (info.completion_tokens > 0) ttft_.Observe(info.ttft_seconds);
  if (info.completion_tokens > 1) {
    tpot_.Observe((info.total_seconds - info.ttft_seconds) / (info.completion_tokens - 1));
  }
  if (info.prefill_seconds >= 0) ttft_prefill_.Observe(info.prefill_seconds);
  if (info.kv_transfer_seconds >= 0) ttft_transfer_.Observe(info.kv_transfer_seconds);
  if (info.first_decode_seconds >= 0) first_decode_.Observe(info.first_decode_seconds);
}

ServerMetrics::Snapshot ServerMetrics::Get() const {
  Snapshot s;
  for (int i = 0; i < kNumOutcomes; ++i) s.outcomes[i] = outcomes_[i].load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generation_tokens = generation_tokens_.load();
  s.ttft = ttft_.Get();
  s.tpot = tpot_.Get();
  s.e2e = e2e_.Get();
  s.queue = queue_.Get();
  return s;
}

std::string ServerMetrics::Render(const serving::BackendStats& stats,
                                  const http_door::DoorStats& door) const {
  PrometheusWriter w;
  std::vector<std::pair<PrometheusWriter::Labels, double>> outcomes;
  for (int i = 0; i < kNumOutcomes; ++i) {
    outcomes.push_back({{{"outcome", OutcomeName(static_cast<Outcome>(i))}},
                        static_cast<double>(outcomes_[i].load())});
  }
  w.Family("tandem_requests_total", "counter",
           "Requests by outcome: success (stop), length, cancelled, error, rejected (429/503), "
           "timeout, bad_request (other 4xx).",
           outcomes);
  w.Counter("tandem_prompt_tokens_total",
            "Prompt tokens of finished requests (cached or computed).",
            static_cast<double>(prompt_tokens_.load()));
  w.Counter("tandem_generation_tokens_total", "Tokens generated for finished requests.",
            static_cast<double>(generation_tokens_.load()));
  w.Counter("tandem_prefix_cache_hit_tokens_total",
            "Prompt tokens served from the prefix cache (local, or read from the KV pool).",
            static_cast<double>(stats.prefix_cache_hit_tokens));
  w.Counter("tandem_kv_pool_hit_tokens_total",
            "Prompt tokens read from the cluster KV pool (part of the prefix cache hits).",
            static_cast<double>(stats.pool_hit_tokens));
  w.Counter("tandem_prompt_tokens_computed_total",
            "Prompt tokens the backend computed (not cached).",
            static_cast<double>(stats.prompt_tokens));
  w.Counter("tandem_preemptions_total", "Sequences preempted for KV capacity.",
            static_cast<double>(stats.preemptions));
  w.Family("tandem_preemption_tokens_total", "counter",
           "Tokens of preempted sequences: their KV offloaded to the KV pool at preemption "
           "(offloaded), and how they came back on resuming (resumed_cache: the local prefix "
           "cache; resumed_pool: the KV pool; recomputed).",
           {{{{"outcome", "offloaded"}}, double(stats.preempt_offloaded_tokens)},
            {{{"outcome", "resumed_cache"}}, double(stats.preempt_resumed_cache_tokens)},
            {{{"outcome", "resumed_pool"}}, double(stats.preempt_resumed_pool_tokens)},
            {{{"outcome", "recomputed"}}, double(stats.preempt_recomputed_tokens)}});
  w.Counter("tandem_kv_pool_fetches_skipped_total",
            "Admissions that did not read the KV pool because computing a block was measured "
            "cheaper than fetching it.",
            static_cast<double>(stats.pool_fetches_skipped));
  w.Counter("tandem_kv_pool_window_misses_total",
            "Sliding-window models: reads from the KV pool given up because the windows behind "
            "a prefix's end could not be read (the prefix was computed instead).",
            static_cast<double>(stats.pool_window_misses));
  w.Histogram("tandem_time_to_first_token_seconds", "Arrival to first generated token.",
              ttft_.Get());
  w.Histogram("tandem_time_per_output_token_seconds", "Mean time per output token after the first.",
              tpot_.Get());
  w.Histogram("tandem_e2e_request_latency_seconds", "Arrival to finish.", e2e_.Get());
  w.Histogram("tandem_queue_time_seconds", "Arrival to first scheduled.", queue_.Get());
  w.Histogram("tandem_ttft_prefill_seconds",
              "Disaggregated requests: first scheduled on the prefill worker to its first token, "
              "steps shared with other prompts included.",
              ttft_prefill_.Get());
  w.Histogram("tandem_ttft_kv_transfer_seconds",
              "Disaggregated requests: KV still moving after the last layer was computed.",
              ttft_transfer_.Get());
  w.Histogram("tandem_first_decode_step_seconds",
              "Disaggregated requests: KV landed on the decode worker to its first decode step.",
              first_decode_.Get());
  w.Gauge("tandem_requests_running", "Requests being computed.", stats.running);
  w.Gauge("tandem_requests_waiting", "Requests queued for admission.", stats.waiting);
  w.Gauge("tandem_kv_blocks_used", "KV-cache blocks held by requests.", stats.kv_blocks_used);
  w.Gauge("tandem_kv_blocks_cached",
          "KV-cache blocks held only by the prefix cache (reusable; evicted when needed).",
          stats.kv_blocks_cached);
  w.Gauge("tandem_kv_blocks_free", "KV-cache blocks free.",
          stats.kv_blocks_total - stats.kv_blocks_used - stats.kv_blocks_cached);
  if (stats.kv_window_blocks_total > 0) {
    w.Gauge("tandem_kv_window_blocks_used",
            "Window blocks (sliding-window layers' KV) lent to blocks inside some window.",
            stats.kv_window_blocks_used);
    w.Gauge("tandem_kv_window_blocks_free", "Window blocks free.",
            stats.kv_window_blocks_total - stats.kv_window_blocks_used);
  }
  w.Gauge("tandem_kv_blocks_reserved", "KV-cache blocks reserved for KV being transferred in.",
          stats.reserved_blocks);
  w.Counter("tandem_kv_reservations_expired_total",
            "KV reservations freed because no transfer claimed them in time.",
            static_cast<double>(stats.reservations_expired));
  if (stats.engine_threads > 0) {
    // One engine (colocated): the families the conductor exports per worker, with this
    // process as the only worker, so that utilisation reads the same in both modes.
    const PrometheusWriter::Labels self = {{"worker", "colocated"}, {"role", "mixed"}};
    auto phase = [&](const char* p) {
      PrometheusWriter::Labels l = self;
      l.emplace_back("phase", p);
      return l;
    };
    w.Family("tandem_worker_busy_seconds_total", "counter", serving::kBusySecondsHelp,
             {{phase("prefill"), stats.busy_seconds_prefill},
              {phase("decode"), stats.busy_seconds_decode}});
    w.Family("tandem_worker_busy_core_seconds_total", "counter", serving::kBusyCoreSecondsHelp,
             {{phase("prefill"), stats.busy_core_seconds_prefill},
              {phase("decode"), stats.busy_core_seconds_decode}});
    w.Family("tandem_worker_computed_tokens_total", "counter", serving::kComputedTokensHelp,
             {{phase("prefill"), static_cast<double>(stats.computed_tokens_prefill)},
              {phase("decode"), static_cast<double>(stats.computed_tokens_decode)}});
    w.Family("tandem_worker_threads", "gauge", serving::kThreadsHelp,
             {{self, static_cast<double>(stats.engine_threads)}});
    w.Family("tandem_worker_sampling_seconds_total", "counter", serving::kSamplingSecondsHelp,
             {{self, stats.sampling_seconds}});
  }
  const ProcessMemory memory = ReadProcessMemory();
  w.Gauge("tandem_process_resident_bytes", "Resident set of this process (VmRSS).",
          static_cast<double>(memory.resident_bytes));
  w.Gauge("tandem_process_peak_resident_bytes",
          "Peak resident set of this process since it started (VmHWM).",
          static_cast<double>(memory.peak_resident_bytes));
  // Backend-specific families, grouped by name in first-seen order; the engine's memory
  // (colocated: this process, as the only worker).
  std::vector<serving::ExtraMetric> extra = stats.extra;
  serving::AppendMemoryMetrics(stats, {{"worker", "colocated"}, {"role", "mixed"}}, &extra);
  std::vector<std::string> names;
  for (const auto& m : extra) {
    if (std::find(names.begin(), names.end(), m.name) == names.end()) names.push_back(m.name);
  }
  for (const auto& name : names) {
    std::vector<std::pair<PrometheusWriter::Labels, double>> samples;
    std::string help;
    bool counter = false;
    for (const auto& m : extra) {
      if (m.name != name) continue;
      samples.push_back({m.labels, m.value});
      if (help.empty()) help = m.help;
      counter = m.counter;
    }
    w.Family(name, counter ? "counter" : "gauge", help, samples);
  }
  for (const auto& h : stats.extra_histograms) w.Histogram(h.name, h.help, h.snapshot);
  w.Gauge("tandem_http_connections_open", "Client connections open at the front door.",
          static_cast<double>(door.connections_open));
  w.Counter("tandem_http_connections_total", "Client connections accepted.",
            static_cast<double>(door.connections_accepted));
  w.Counter("tandem_http_connections_refused_total",
            "Connections closed at once: the connection limit was reached.",
            static_cast<double>(door.connections_refused));
  w.Family("tandem_http_timeouts_total", "counter",
           "Connections closed by a deadline: idle (no request started), request (not read "
           "whole in time: slow senders), write (the client stopped reading).",
           {{{{"kind", "idle"}}, static_cast<double>(door.idle_timeouts)},
            {{{"kind", "request"}}, static_cast<double>(door.request_timeouts)},
            {{{"kind", "write"}}, static_cast<double>(door.write_timeouts)}});
  w.Counter("tandem_http_client_closes_total",
            "Connections the client closed while its request was being answered (the request "
            "is cancelled).",
            static_cast<double>(door.client_closes));
  return w.text();
}

}  // namespace tandem::server
