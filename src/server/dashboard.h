// The live dashboard: GET /dashboard is one self-contained page (HTML, CSS and JavaScript built
// into the binary, nothing fetched from elsewhere) that polls GET /dashboard/data, a JSON
// snapshot of the server's cumulative figures; the page turns successive snapshots into rates,
// windows and charts (throughput, TTFT/TPOT percentiles, SLO attainment, utilisation per worker,
// recent rejections and faults). Neither needs the API key (like /metrics: operators' pages).
#pragma once

#include <string>

#include "server/metrics.h"
#include "serving/backend.h"

namespace tandem::server {

// The page.
const std::string& DashboardPage();

// The snapshot: {"time", "model", "outcomes": {...}, "prompt_tokens", "generation_tokens",
// "running", "waiting", "kv": {"total", "used", "cached"}, "window_kv", "prefix_hit_tokens",
// "pool_hit_tokens", "preemptions", "histograms": {"ttft"|"tpot"|"e2e"|"queue": {"bounds",
// "cumulative", "count", "sum"}}, "workers": [{"name", "role", "metrics": {name[.phase]: v}}],
// "metrics": [{"name", "labels", "value"}] (the backend's other figures), "connections":
// {"open", "accepted", "refused", "timeouts"} (the front door's)}.
std::string DashboardJson(const ServerMetrics::Snapshot& m, const serving::BackendStats& stats,
                          const std::string& model, const http_door::DoorStats& door = {});

}  // namespace tandem::server
