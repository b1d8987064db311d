#include "conductor/policy/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace tandem::conductor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// kCacheAware: requests in flight a prefill worker may have beyond the least loaded one and
// still be chosen for the prefix it holds.
constexpr int kCacheAffinitySlack = 2;

// Lower is better: fewer requests in flight, more free KV, then the name (deterministic).
auto LoadKey(const WorkerSnapshot& w) {
  return std::make_tuple(w.inflight, -w.kv_free_blocks, w.name);
}

bool Excluded(std::span<const int> exclude, int i) {
  return std::find(exclude.begin(), exclude.end(), i) != exclude.end();
}

// Prompt tokens the worker holds for this request, in whole blocks, leaving one to compute.
int CachedTokens(const WorkerSnapshot& w, const RequestShape& r) {
  const int bt = std::max(1, w.block_tokens);
  return std::min(w.cached_prompt_tokens, r.prompt_tokens - 1) / bt * bt;
}

std::string Ms(double s) {
  return std::to_string(static_cast<int64_t>(std::llround(s * 1000))) + " ms";
}

}  // namespace

const char* PlacementPolicyName(PlacementPolicy p) {
  switch (p) {
    case PlacementPolicy::kRandom: return "random";
    case PlacementPolicy::kLoadBalance: return "load-balance";
    case PlacementPolicy::kCacheAware: return "cache-aware";
    case PlacementPolicy::kCacheLoad: return "cache-load";
  }
  return "unknown";
}

StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name) {
  for (auto p : {PlacementPolicy::kRandom, PlacementPolicy::kLoadBalance,
                 PlacementPolicy::kCacheAware, PlacementPolicy::kCacheLoad}) {
    if (name == PlacementPolicyName(p)) return p;
  }
  return InvalidArgument("unknown placement policy '" + name +
                         "' (random, load-balance, cache-aware, cache-load)");
}

const char* AdmissionPolicyName(AdmissionPolicy p) {
  switch (p) {
    case AdmissionPolicy::kNone: return "none";
    case AdmissionPolicy::kEarly: return "early";
    case AdmissionPolicy::kPredictive: return "predictive";
  }
  return "unknown";
}

StatusOr<AdmissionPolicy> ParseAdmissionPolicy(const std::string& name) {
  for (auto p : {AdmissionPolicy::kNone, AdmissionPolicy::kEarly, AdmissionPolicy::kPredictive}) {
    if (name == AdmissionPolicyName(p)) return p;
  }
  return InvalidArgument("unknown admission policy '" + name + "' (none, early, predictive)");
}

int DecodeBlocksNeeded(int prompt_tokens, int cached_tokens, int block_tokens) {
  const int bt = block_tokens > 0 ? block_tokens : 16;
  return std::max(0, (prompt_tokens + 1 + bt - 1) / bt - cached_tokens / bt);
}

std::pair<int64_t, int64_t> DecodeBatchAt(const WorkerSnapshot& w, double t_s,
                                          int64_t extra_context) {
  int64_t batch = 1, context = extra_context;
  for (const DecodeSequence& s : w.decoding) {
    if (s.joins_in_s <= t_s && s.ends_in_s > t_s) {
      ++batch;
      context += s.context_tokens;
    }
  }
  return {batch, context};
}

double PredictTbt(const WorkerSnapshot& d, const RequestShape& r, double join_s) {
  if (!d.cost.valid()) return 0;
  const auto [batch, context] = DecodeBatchAt(d, join_s, r.prompt_tokens);
  const double step = d.cost.DecodeStepSeconds(batch, context);
  const double local_work = std::max(0.0, d.prefill_queue_s - join_s);
  if (local_work <= 0) return step;
  const int64_t tokens = std::max(1, r.expected_output_tokens);
  const int64_t chunk = std::max<int64_t>(1, d.max_batch_tokens - batch);
  const double chunk_s = d.cost.PrefillSeconds(chunk, 0);
  return step +
         std::min(local_work, static_cast<double>(tokens) * chunk_s) / static_cast<double>(tokens);
}

double PredictRemoteTtft(const WorkerSnapshot& prefill, const RequestShape& r) {
  if (!prefill.cost.valid()) return kInf;
  const int64_t cached = CachedTokens(prefill, r);
  return prefill.prefill_queue_s + prefill.cost.PrefillSeconds(r.prompt_tokens - cached, cached) +
         prefill.kv_transfer_s;
}

double PredictLocalTtft(const WorkerSnapshot& decode, const RequestShape& r) {
  if (!decode.cost.valid()) return kInf;
  const int64_t cached = CachedTokens(decode, r);
  const int64_t n_new = r.prompt_tokens - cached;
  const auto [batch, context] = DecodeBatchAt(decode, 0, 0);
  const int64_t others = batch - 1;  // the sequences decoding now share every step
  const int64_t chunk = std::max<int64_t>(1, decode.max_batch_tokens - others);
  const int64_t steps = (n_new + chunk - 1) / chunk;
  const double shared = others > 0 ? steps * decode.cost.DecodeStepSeconds(others, context) : 0;
  return decode.prefill_queue_s + decode.cost.PrefillSeconds(n_new, cached) + shared;
}

Placement Place(std::span<const WorkerSnapshot> workers, const RequestShape& r,
                const PlacementOptions& o, std::span<const int> exclude_prefill) {
  Placement p;
  const int n = static_cast<int>(workers.size());
  const bool predict = o.policy == PlacementPolicy::kCacheLoad;

  // ---- prefill worker ----
  std::vector<int> prefillers;
  for (int i = 0; i < n; ++i) {
    const WorkerSnapshot& w = workers[i];
    if (w.healthy && w.role == WorkerRole::kPrefill && !Excluded(exclude_prefill, i)) {
      prefillers.push_back(i);
    }
  }
  double remote_ttft = kInf;
  if (!prefillers.empty()) {
    int best = prefillers[0];
    switch (o.policy) {
      case PlacementPolicy::kRandom: best = prefillers[o.random_draw % prefillers.size()]; break;
      case PlacementPolicy::kLoadBalance:
        for (int i : prefillers) {
          if (LoadKey(workers[i]) < LoadKey(workers[best])) best = i;
        }
        break;
      case PlacementPolicy::kCacheAware:
      case PlacementPolicy::kCacheLoad: {
        // kCacheLoad: minimum predicted TTFT; without cost models (or kCacheAware) the longest
        // cached prefix, then load. kCacheAware bounds affinity by load: a worker with more
        // than kCacheAffinitySlack requests in flight beyond the least loaded one is not chosen
        // for its cache (pure affinity sends every prompt that shares a system prompt to the
        // first worker that computed it).
        int least_inflight = workers[prefillers[0]].inflight;
        for (int i : prefillers) least_inflight = std::min(least_inflight, workers[i].inflight);
        const int max_inflight = least_inflight + kCacheAffinitySlack;
        auto key = [&](int i) {
          const double ttft = predict ? PredictRemoteTtft(workers[i], r) : 0.0;
          const bool too_busy = !predict && workers[i].inflight > max_inflight;
          return std::make_tuple(too_busy, ttft, -workers[i].cached_prompt_tokens,
                                 LoadKey(workers[i]));
        };
        for (int i : prefillers) {
          if (key(i) < key(best)) best = i;
        }
        break;
      }
    }
    p.prefill = best;
    remote_ttft = PredictRemoteTtft(workers[best], r);
  }

  // ---- decode worker ----
  std::vector<int> decoders;
  bool any_decoder = false;
  for (int i = 0; i < n; ++i) {
    const WorkerSnapshot& w = workers[i];
    if (!w.healthy || w.role == WorkerRole::kPrefill) continue;
    any_decoder = true;
    if (DecodeBlocksNeeded(r.prompt_tokens, CachedTokens(w, r), w.block_tokens) <=
        w.kv_free_blocks) {
      decoders.push_back(i);
    }
  }
  if (!any_decoder) {
    p.outcome = Placement::Outcome::kNoWorker;
    p.reason = "no_decode_worker";
    p.message = "no decode worker is available";
    return p;
  }
  if (decoders.empty()) {
    p.outcome = Placement::Outcome::kWait;
    p.reason = "kv_full";
    p.message = "no decode worker has room for the prompt's KV cache now";
    return p;
  }
  // The decode batch is judged when this request joins it: now (kEarly, and kNone's
  // predictions) or at the end of its prefill (kPredictive).
  const double join_s =
      o.admission == AdmissionPolicy::kPredictive && std::isfinite(remote_ttft) ? remote_ttft : 0;
  auto tbt_of = [&](int i) { return PredictTbt(workers[i], r, join_s); };
  int decode = decoders[0];
  bool tbt_met = true;
  switch (o.policy) {
    case PlacementPolicy::kRandom:
      decode = decoders[(o.random_draw / 7919) % decoders.size()];
      break;
    case PlacementPolicy::kLoadBalance:
    case PlacementPolicy::kCacheAware:
      for (int i : decoders) {
        if (LoadKey(workers[i]) < LoadKey(workers[decode])) decode = i;
      }
      break;
    case PlacementPolicy::kCacheLoad: {
      if (prefillers.empty()) {
        // Colocated (mixed workers only): the prompt is computed where it decodes, so the
        // worker with the lowest predicted TTFT among those that keep the TBT SLO wins.
        auto key = [&](int i) {
          const bool breaks = r.slo_tbt_s > 0 && tbt_of(i) > r.slo_tbt_s;
          return std::make_tuple(breaks, PredictLocalTtft(workers[i], r), LoadKey(workers[i]));
        };
        for (int i : decoders) {
          if (key(i) < key(decode)) decode = i;
        }
        tbt_met = r.slo_tbt_s <= 0 || tbt_of(decode) <= r.slo_tbt_s;
        break;
      }
      if (r.slo_tbt_s > 0 && o.pack_decode) {
        // Pack: the busiest worker that still meets the TBT SLO.
        int packed = -1;
        for (int i : decoders) {
          if (tbt_of(i) > r.slo_tbt_s) continue;
          if (packed < 0 || std::make_tuple(-tbt_of(i), workers[i].name) <
                                std::make_tuple(-tbt_of(packed), workers[packed].name)) {
            packed = i;
          }
        }
        if (packed >= 0) {
          decode = packed;
          break;
        }
        tbt_met = false;
      }
      for (int i : decoders) {  // spread: the lowest predicted step time
        if (std::make_tuple(tbt_of(i), LoadKey(workers[i])) <
            std::make_tuple(tbt_of(decode), LoadKey(workers[decode]))) {
          decode = i;
        }
      }
      break;
    }
  }
  const WorkerSnapshot& d = workers[decode];
  p.decode = decode;
  p.decode_cached_tokens = CachedTokens(d, r);
  p.predicted_tbt_s = tbt_of(decode);
  if (r.slo_tbt_s > 0 && p.predicted_tbt_s > r.slo_tbt_s) tbt_met = false;

  // ---- conditional disaggregation ----
  p.local = p.prefill < 0;
  const double local_ttft = PredictLocalTtft(d, r);  // infinite without a cost model
  if (predict && o.allow_local_prefill && d.cost.valid() && p.prefill >= 0) {
    bool keeps_tbt = true;
    if (r.slo_tbt_s > 0) {
      // While the prompt is computed, each of the batch's steps carries a prefill chunk.
      const auto [batch, context] = DecodeBatchAt(d, 0, 0);
      const int64_t others = batch - 1;
      const int64_t chunk = std::max<int64_t>(1, d.max_batch_tokens - others);
      const int64_t n_new = r.prompt_tokens - p.decode_cached_tokens;
      // Prompts already queued there fill every step's chunk: then this one's steps carry a
      // whole chunk, not only its own tokens.
      const int64_t tokens = d.prefill_queue_s > 0 ? chunk : std::min(chunk, n_new);
      const double step = (others > 0 ? d.cost.DecodeStepSeconds(others, context) : 0) +
                          d.cost.PrefillSeconds(tokens, p.decode_cached_tokens);
      keeps_tbt = step <= r.slo_tbt_s;
    }
    if (local_ttft <= o.local_prefill_gain * remote_ttft && keeps_tbt) p.local = true;
  }
  if (p.local) {
    p.prefill = -1;
    p.predicted_ttft_s = d.cost.valid() ? local_ttft : 0;
    p.predicted_prefill_s = d.cost.valid()
                                ? d.cost.PrefillSeconds(r.prompt_tokens - p.decode_cached_tokens,
                                                        p.decode_cached_tokens)
                                : 0;
  } else {
    const WorkerSnapshot& pw = workers[p.prefill];
    p.predicted_ttft_s = std::isfinite(remote_ttft) ? remote_ttft : 0;
    const int64_t cached = CachedTokens(pw, r);
    p.predicted_prefill_s =
        pw.cost.valid() ? pw.cost.PrefillSeconds(r.prompt_tokens - cached, cached) : 0;
  }

  // ---- admission ----
  if (o.admission != AdmissionPolicy::kNone) {
    if (r.slo_ttft_s > 0 && p.predicted_ttft_s > r.slo_ttft_s) {
      p.outcome = Placement::Outcome::kReject;
      p.reason = "ttft_slo";
      p.message = "the predicted time to first token (" + Ms(p.predicted_ttft_s) +
                  ") exceeds the TTFT SLO (" + Ms(r.slo_ttft_s) + ")";
      p.retry_after_s = p.predicted_ttft_s - r.slo_ttft_s;
      return p;
    }
    if (!tbt_met) {
      p.outcome = Placement::Outcome::kReject;
      p.reason = "tbt_slo";
      p.message = "every decode worker's predicted time between tokens with this request (best " +
                  Ms(p.predicted_tbt_s) + ") exceeds the TBT SLO (" + Ms(r.slo_tbt_s) + ")";
      // The batch shrinks as sequences end: the soonest end is a fair hint.
      double soonest = kInf;
      for (const DecodeSequence& s : d.decoding) soonest = std::min(soonest, s.ends_in_s);
      p.retry_after_s = std::isfinite(soonest) ? soonest : 1.0;
      return p;
    }
  }
  p.outcome = Placement::Outcome::kPlaced;
  return p;
}

}  // namespace tandem::conductor
