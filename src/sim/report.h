// A simulation's results in the format of `tandem bench serve` (bench/serving/servebench):
// results.json ({"config", "summary", "requests"}), summary.json and summary.md, so that
// `tandem bench serve --compare` tabulates and plots simulated runs beside measured ones; and
// utilisation.json (each instance's busy share per interval).
//
// The summary follows servebench/metrics.py: TTFT, TPOT, ITL, TBT (mean of a request's slowest
// 10% of gaps) and E2E statistics over completed requests, percentiles by linear interpolation,
// goodput and SLO attainment over all requests (failed ones count as misses).
#pragma once

#include <string>

#include "common/status.h"
#include "sim/simulator.h"

namespace tandem::sim {

// The summary object (JSON text).
std::string SummaryJson(const SimResult& result, double slo_ttft_s, double slo_tbt_s);

// Writes the files into `dir` (created). `config_json`: an object describing the run.
Status WriteResults(const std::string& dir, const SimResult& result, double slo_ttft_s,
                    double slo_tbt_s, const std::string& config_json);

}  // namespace tandem::sim
