#include "conductor/policy/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace tandem::conductor {
namespace {

using Action = PlannerDecision::Action;

bool IsDecodeCapable(WorkerRole r) { return r != WorkerRole::kPrefill; }

// The worker of `role` that can change now and costs least to move: for a decode worker the
// fewest streams (then the least KV in use), for a prefill worker the least queued work. -1 if
// none (unhealthy, or changed role within the dwell time).
int Candidate(const PlannerInput& in, WorkerRole role, double dwell_s) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(in.workers.size()); ++i) {
    const PlannerWorker& w = in.workers[i];
    if (!w.healthy || w.role != role || w.since_switch_s < dwell_s) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const PlannerWorker& b = in.workers[best];
    const bool better = role == WorkerRole::kDecode
                            ? std::tie(w.decoding, w.kv_used) < std::tie(b.decoding, b.kv_used)
                            : w.prefill_queue_s < b.prefill_queue_s;
    if (better) best = i;
  }
  return best;
}

}  // namespace

namespace {

// A prefill worker that could leave the cluster (PlannerDecision::kRemove), or -1. Only the
// prefill pool shrinks: the decode pool stays resident (Mooncake's design; its workers hold
// the streams).
int RemoveCandidate(const PlannerInput& in, const PlannerOptions& o, int n_prefill, int n_decode,
                    double prefill_load) {
  const int keep = o.remove_last_prefill ? o.min_prefill : std::max(1, o.min_prefill);
  if (n_prefill <= keep) return -1;  // the last prefill worker stays, unless allowed to go
  // Its prompts go to the other prefill workers, or to the decode workers if it was the last.
  const int left = n_prefill > 1 ? n_prefill - 1 : n_decode;
  if (left <= 0 || prefill_load * n_prefill / left >= o.high) return -1;
  for (size_t i = 0; i < in.workers.size(); ++i) {
    const PlannerWorker& w = in.workers[i];
    if (w.role == WorkerRole::kPrefill && w.healthy && w.since_switch_s >= o.dwell_s &&
        w.idle_s >= o.remove_idle_s && w.prefill_queue_s == 0 && w.decoding == 0 &&
        w.seq_used == 0) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

const char* PlannerActionName(Action a) {
  switch (a) {
    case Action::kNone: return "none";
    case Action::kToPrefill: return "to_prefill";
    case Action::kToDecode: return "to_decode";
  }
  return "unknown";
}

std::string PlannerScaleName(const PlannerDecision& d) {
  switch (d.scale) {
    case PlannerDecision::Scale::kNone: return "none";
    case PlannerDecision::Scale::kAdd:
      return d.scale_role == WorkerRole::kPrefill ? "add_prefill" : "add_decode";
    case PlannerDecision::Scale::kRemove: return "remove";
  }
  return "none";
}

PlannerDecision PlanPools(const PlannerInput& in, const PlannerOptions& o) {
  PlannerDecision d;
  const double ttft = in.slo_ttft_s > 0 ? in.slo_ttft_s : o.ttft_scale_s;
  const double tbt = in.slo_tbt_s > 0 ? in.slo_tbt_s : o.tbt_scale_s;
  int n_prefill = 0, n_decode = 0;
  double queued_s = in.held_prefill_s, prefill_busy = 0, decode_sum = 0;
  for (const PlannerWorker& w : in.workers) {
    if (!w.healthy) continue;
    queued_s += w.prefill_queue_s;
    if (w.role == WorkerRole::kPrefill) {
      ++n_prefill;
      prefill_busy += w.busy_share;
    }
    if (IsDecodeCapable(w.role)) {
      ++n_decode;
      decode_sum += std::max({w.decode_step_s / tbt, w.kv_used, w.seq_used});
    }
  }
  // Without prefill workers the decode workers compute the prompts.
  const int prefill_capacity = n_prefill > 0 ? n_prefill : n_decode;
  d.prefill_load = prefill_capacity > 0 ? queued_s / (prefill_capacity * ttft) : 0;
  if (n_prefill > 0) d.prefill_load = std::max(d.prefill_load, prefill_busy / n_prefill);
  d.decode_load = n_decode > 0 ? decode_sum / n_decode : 0;
  if (in.ttft_rejected_share >= o.rejected_share) {
    d.prefill_load = std::max(d.prefill_load, o.high + in.ttft_rejected_share);
  }
  if (in.tbt_rejected_share >= o.rejected_share) {
    d.decode_load = std::max(d.decode_load, o.high + in.tbt_rejected_share);
  }
  d.prefill_workers = n_prefill;
  d.decode_workers = n_decode;
  auto figures = [&] {
    return fmt::format("prefill load {:.2f} over {} workers, decode load {:.2f} over {}",
                       d.prefill_load, n_prefill, d.decode_load, n_decode);
  };
  const bool wants_prefill = d.prefill_load > o.high;
  const bool wants_decode = d.decode_load > o.high;
  auto none = [&](const char* reason) {
    d.reason = reason;
    d.detail = figures();
    const std::string r = reason;
    if ((r == "both_loaded" || r == "min_pool") && (wants_prefill || wants_decode)) {
      d.scale = PlannerDecision::Scale::kAdd;
      // With no prefill worker the decode workers compute the prompts, which loads them
      // too: a prefill worker relieves both pools.
      d.scale_role =
          wants_prefill && (n_prefill == 0 || !wants_decode || d.prefill_load >= d.decode_load)
              ? WorkerRole::kPrefill
              : WorkerRole::kDecode;
    } else if (r == "balanced" && d.prefill_load < o.low && d.decode_load < o.low) {
      d.scale_worker = RemoveCandidate(in, o, n_prefill, n_decode, d.prefill_load);
      if (d.scale_worker >= 0) d.scale = PlannerDecision::Scale::kRemove;
    }
    return d;
  };

  if (wants_prefill == wants_decode) return none(wants_prefill ? "both_loaded" : "balanced");
  if (in.since_last_switch_s < o.dwell_s / 2) return none("dwell");

  if (wants_prefill) {
    // A decode worker goes to prefill if the decode pool can spare it.
    const double decode_after =
        n_decode > 1 ? d.decode_load * n_decode / (n_decode - 1) : 1e9;  // 1e9: cannot give
    if (n_decode <= o.min_decode) return none("min_pool");
    if (d.decode_load >= o.low || decode_after >= o.high) return none("both_loaded");
    const int i = Candidate(in, WorkerRole::kDecode, o.dwell_s);
    if (i < 0) return none("no_candidate");
    d.action = Action::kToPrefill;
    d.worker = i;
    d.reason = "prefill_load";
    d.prefill_workers = n_prefill + 1;
    d.decode_workers = n_decode - 1;
    d.detail = fmt::format("{}: {} (decode load {:.2f} after)", in.workers[i].name, figures(),
                           decode_after);
    return d;
  }
  // A prefill worker goes to decode if the prefill pool (or, with no prefill worker left, the
  // decode pool computing prompts too) can take its queue.
  const double prefill_after = n_prefill > 1
                                   ? d.prefill_load * n_prefill / (n_prefill - 1)
                                   : d.prefill_load * std::max(n_prefill, 1) / (n_decode + 1);
  if (n_prefill <= o.min_prefill) return none("min_pool");
  if (d.prefill_load >= o.low || prefill_after >= o.high) return none("both_loaded");
  const int i = Candidate(in, WorkerRole::kPrefill, o.dwell_s);
  if (i < 0) return none("no_candidate");
  d.action = Action::kToDecode;
  d.worker = i;
  d.reason = "decode_load";
  d.prefill_workers = n_prefill - 1;
  d.decode_workers = n_decode + 1;
  d.detail = fmt::format("{}: {} (prefill load {:.2f} after)", in.workers[i].name, figures(),
                         prefill_after);
  return d;
}

}  // namespace tandem::conductor
