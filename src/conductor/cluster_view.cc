#include "conductor/cluster_view.h"

#include <algorithm>

namespace tandem::conductor {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Prompt keys placed on a worker count as cached there for this long (until its /stats shows
// them, or shows they were evicted).
constexpr auto kPlacedKeyLifetime = std::chrono::seconds(10);

// Prefill predictions shorter than this do not correct a worker's scale (seconds).
constexpr double kMinLearnedPrefillS = 0.1;

// A slow moving average of measured / unscaled-predicted ratios, kept within [1/2, 3].
double UpdateScale(double scale, double ratio) {
  return std::clamp(0.9 * scale + 0.1 * std::clamp(ratio, 0.5, 3.0), 0.5, 3.0);
}

// The earliest placement of a key is the one that computes it.
void AddPlacedKey(ClusterView::Worker* w, uint64_t key, uint64_t seq, Clock::time_point now) {
  auto [it, inserted] = w->placed_keys.try_emplace(key, ClusterView::Worker::PlacedKey{now, seq});
  if (!inserted) {
    it->second.at = now;
    it->second.seq = std::min(it->second.seq, seq);
  }
}

}  // namespace

WorkerRole ToPolicyRole(cluster::Role r) {
  switch (r) {
    case cluster::Role::kPrefill: return WorkerRole::kPrefill;
    case cluster::Role::kDecode: return WorkerRole::kDecode;
    case cluster::Role::kMixed: return WorkerRole::kMixed;
  }
  return WorkerRole::kMixed;
}

ClusterView::Worker* ClusterView::Find(const std::string& name) {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

std::string ClusterView::ApplyProbe(const cluster::WorkerInfo& info,
                                    const StatusOr<cluster::WorkerStats>& stats,
                                    Clock::time_point probe_start, Clock::duration worker_timeout) {
  std::string event;
  Worker& w = workers_[info.name];
  if (w.info.incarnation != info.incarnation) {
    event = std::string(w.info.incarnation != 0 ? "rejoined" : "joined");
    w.joined_at = Clock::now();
    w.info = info;
    w.healthy = false;
    w.client = std::make_shared<WorkerClient>(info.host, info.port);
    w.reported_keys.clear();
    w.placed_keys.clear();
  }
  const auto now = Clock::now();
  w.listed = true;
  if (w.info.role != info.role && now - w.role_set_at > kRoleSettleTime) {
    event = std::string("is ") + cluster::RoleName(info.role) + " now";
    w.info.role = info.role;
  }
  if (info.threads == w.info.threads || now - w.threads_set_at > kRoleSettleTime) {
    if (info.threads != w.info.threads) {
      if (event.empty()) event = "computes on " + std::to_string(info.threads) + " threads now";
      // The measured/predicted corrections were learnt at the old count.
      w.prefill_scale = w.decode_scale = 1.0;
    }
    w.info.threads = info.threads;
    w.info.max_threads = info.max_threads;
    w.info.cost = info.cost;
  }
  if (stats.ok()) {
    SampleBusy(&w, stats->backend, now);
    w.stats = *stats;
    w.last_ok = now;
    if (!w.healthy && event.empty()) event = "answers again";
    w.healthy = true;
    w.reported_keys = std::unordered_set<uint64_t>(stats->cached_block_keys.begin(),
                                                   stats->cached_block_keys.end());
    ExpirePlacedKeys(&w, now);
    // Reservations made before this probe started are in its figures now.
    for (auto it = w.promises.begin(); it != w.promises.end();) {
      it = it->second.confirmed < probe_start ? w.promises.erase(it) : std::next(it);
    }
  } else if (w.healthy && now - w.last_ok > worker_timeout) {
    w.healthy = false;
    event = "stopped answering";
  }
  return event;
}

double ClusterView::DecodeStepSeconds(const Worker& w, int* batch) {
  int64_t context = 0;
  *batch = 0;
  for (const auto& [seq, d] : w.decodes) {
    if (!d.joined) continue;
    ++*batch;
    context += d.prompt_tokens + d.emitted;
  }
  return w.info.cost.valid() && *batch > 0 ? w.info.cost.DecodeStepSeconds(*batch, context) : 0;
}

void ClusterView::SampleBusy(Worker* w, const serving::BackendStats& b, Clock::time_point now) {
  const double busy = b.busy_seconds_prefill + b.busy_seconds_decode;
  const double dt = std::chrono::duration<double>(now - w->busy_sampled_at).count();
  // A first sample, or a restarted worker (its counters start again): no rate yet.
  if (w->busy_seconds >= 0 && busy >= w->busy_seconds && dt > 0) {
    if (busy > w->busy_seconds) w->last_busy_at = now;
    const double share = std::clamp((busy - w->busy_seconds) / dt, 0.0, 1.0);
    const double weight = std::min(1.0, dt / kBusyAverageTime);
    w->busy_share += weight * (share - w->busy_share);
  }
  w->busy_seconds = busy;
  w->busy_sampled_at = now;
}

void ClusterView::ExpirePlacedKeys(Worker* w, Clock::time_point now) {
  for (auto it = w->placed_keys.begin(); it != w->placed_keys.end();) {
    it = now - it->second.at > kPlacedKeyLifetime ? w->placed_keys.erase(it) : std::next(it);
  }
}

std::vector<std::string> ClusterView::MarkUnlisted(const std::unordered_set<std::string>& listed) {
  std::vector<std::string> gone;
  for (auto& [name, w] : workers_) {
    if (!listed.count(name)) w.listed = false;
    if (!listed.count(name) && w.healthy) {
      w.healthy = false;
      gone.push_back(name);
    }
  }
  return gone;
}

double ClusterView::QueueSeconds(const Worker& w, Clock::time_point now, uint64_t before_seq) {
  double sent = 0, held = 0;
  Clock::time_point oldest = Clock::time_point::max();
  for (const auto& [seq, job] : w.prefills) {
    if (seq >= before_seq) break;  // ordered by seq
    if (job.started == Clock::time_point::max()) {
      held += job.predicted_s;
    } else {
      sent += job.predicted_s;
      oldest = std::min(oldest, job.started);
    }
  }
  // The worker has been on its oldest sent job since that was sent or, if it was sent while
  // an earlier one ran, since that one ended (prefills run in arrival order): what it has done
  // since then is no longer queued. Held jobs wait behind.
  const double busy =
      oldest == Clock::time_point::max() ? 0 : Seconds(now - std::max(oldest, w.prefill_done_at));
  return std::max(0.0, sent - busy) + held;
}

int ClusterView::FreeBlocks(const Worker& w, uint64_t except_seq) {
  int promised = 0;
  for (const auto& [seq, p] : w.promises) promised += seq == except_seq ? 0 : p.blocks;
  return w.stats.backend.kv_blocks_total - w.stats.backend.kv_blocks_used - promised;
}

std::vector<WorkerSnapshot> ClusterView::Snapshot(const RequestLoad& r, Clock::time_point now,
                                                  std::vector<std::string>* names) const {
  std::vector<WorkerSnapshot> out;
  names->clear();
  for (const auto& [name, w] : workers_) {
    WorkerSnapshot s;
    s.name = name;
    s.role = ToPolicyRole(w.info.role);
    s.healthy = w.healthy;
    s.inflight = static_cast<int>(w.placed.size());
    s.block_tokens = w.info.block_tokens > 0 ? w.info.block_tokens : 16;
    s.kv_free_blocks = FreeBlocks(w);
    // The longest prefix of the prompt the worker holds (whole blocks, leaving one token).
    if (r.block_tokens == s.block_tokens && r.prompt_tokens > 1) {
      const size_t max_blocks = std::min<size_t>(
          r.keys.size(), static_cast<size_t>((r.prompt_tokens - 1) / s.block_tokens));
      const auto& worker = w;  // a lambda may not capture a structured binding (clang 14)
      auto held = [&](uint64_t key) {
        if (worker.reported_keys.count(key)) return true;
        const auto it = worker.placed_keys.find(key);
        return it != worker.placed_keys.end() && it->second.seq < r.seq;
      };
      size_t hit = 0;
      while (hit < max_blocks && held(r.keys[hit])) ++hit;
      s.cached_prompt_tokens = static_cast<int>(hit) * s.block_tokens;
      // A prefill worker that uses the KV pool fetches what the pool holds beyond its own
      // cache (at memory speed: the fetch is left out of the prediction).
      if (s.role == WorkerRole::kPrefill && w.stats.pool_enabled) {
        const int pool =
            std::min(r.pool_prompt_tokens, static_cast<int>(max_blocks) * s.block_tokens);
        s.cached_prompt_tokens = std::max(s.cached_prompt_tokens, pool);
      }
    }
    s.prefill_queue_s = QueueSeconds(w, now, r.seq);
    for (const auto& [seq, d] : w.decodes) {
      DecodeSequence ds;
      ds.context_tokens = d.prompt_tokens + d.emitted;
      ds.joins_in_s = d.joined ? 0 : std::max(0.0, Seconds(d.joins_at - now));
      const int remaining = std::max(1, d.expected_tokens - d.emitted);
      ds.ends_in_s = ds.joins_in_s + remaining * std::max(d.tbt_s, 1e-3);
      s.decoding.push_back(ds);
    }
    s.cost = w.info.cost.Scaled(w.prefill_scale, w.decode_scale);
    s.kv_transfer_s = w.kv_transfer_s;
    s.max_batch_tokens = w.info.max_batch_tokens;
    out.push_back(std::move(s));
    names->push_back(name);
  }
  return out;
}

void ClusterView::Commit(const RequestLoad& r, const Placement& p, const std::string& decode,
                         const std::string& prefill, int expected_output, Clock::time_point now) {
  if (Worker* d = Find(decode)) {
    d->placed.insert(r.seq);
    Worker::DecodeJob job;
    job.prompt_tokens = r.prompt_tokens;
    job.expected_tokens = std::max(1, std::min(r.max_tokens, expected_output));
    job.tbt_s = p.predicted_tbt_s;
    job.joins_at = now + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(p.predicted_ttft_s));
    d->decodes[r.seq] = job;
    if (prefill.empty()) d->prefills[r.seq] = {p.predicted_prefill_s};
  }
  if (Worker* w = prefill.empty() ? nullptr : Find(prefill)) {
    w->placed.insert(r.seq);
    w->prefills[r.seq] = {p.predicted_prefill_s};
    for (uint64_t k : r.keys) AddPlacedKey(w, k, r.seq, now);
  }
}

bool ClusterView::Dispatch(uint64_t seq, const std::string& decode, const std::string& prefill,
                           int blocks, Clock::time_point now) {
  Worker* d = Find(decode);
  if (d == nullptr) return true;  // gone: the decode call will say so
  if (FreeBlocks(*d, seq) < blocks) return false;
  d->promises[seq] = Worker::Promise{std::max(0, blocks)};
  // A local prefill sends no "reserved" event: the worker allocates as it admits the request,
  // and its next /stats shows it.
  if (prefill.empty()) d->promises[seq].confirmed = now;
  Worker* w = prefill.empty() ? d : Find(prefill);
  if (w != nullptr) {
    auto it = w->prefills.find(seq);
    if (it != w->prefills.end()) it->second.started = now;
  }
  return true;
}

void ClusterView::ReservationMade(uint64_t seq, const std::string& decode, Clock::time_point now) {
  if (Worker* d = Find(decode)) {
    auto it = d->promises.find(seq);
    if (it != d->promises.end()) it->second.confirmed = now;
  }
}

void ClusterView::PrefillDone(const RequestLoad& r, const std::string& prefill,
                              const std::string& decode, double transfer_s, Clock::time_point now) {
  const uint64_t seq = r.seq;
  if (Worker* w = prefill.empty() ? nullptr : Find(prefill)) {
    if (w->prefills.erase(seq)) w->prefill_done_at = now;
    w->placed.erase(seq);
    if (transfer_s >= 0) w->kv_transfer_s = 0.8 * w->kv_transfer_s + 0.2 * transfer_s;
  }
  if (Worker* d = Find(decode)) {
    if (d->prefills.erase(seq)) d->prefill_done_at = now;  // a local prefill
    for (uint64_t k : r.keys) AddPlacedKey(d, k, seq, now);
    auto it = d->decodes.find(seq);
    if (it != d->decodes.end()) {
      it->second.joined = true;
      it->second.joins_at = now;
    }
  }
}

void ClusterView::PrefillMeasured(const std::string& worker, int64_t new_tokens,
                                  int64_t cached_tokens, double measured_s) {
  Worker* w = Find(worker);
  if (w == nullptr || !w->info.cost.valid() || measured_s <= 0) return;
  const double predicted = w->info.cost.PrefillSeconds(new_tokens, cached_tokens);
  if (predicted < kMinLearnedPrefillS) return;
  w->prefill_scale = UpdateScale(w->prefill_scale, measured_s / predicted);
}

void ClusterView::DecodeMeasured(const std::string& decode, double predicted_tbt_s,
                                 double measured_tbt_s) {
  Worker* d = Find(decode);
  if (d == nullptr || predicted_tbt_s <= 0 || measured_tbt_s <= 0) return;
  d->decode_scale =
      UpdateScale(d->decode_scale, measured_tbt_s / (predicted_tbt_s / d->decode_scale));
}

void ClusterView::TokenEmitted(uint64_t seq, const std::string& decode) {
  if (Worker* d = Find(decode)) {
    auto it = d->decodes.find(seq);
    if (it != d->decodes.end()) it->second.emitted++;
  }
}

void ClusterView::ReassignPrefill(uint64_t seq, const std::string& prefill,
                                  double predicted_prefill_s, Clock::time_point now) {
  if (Worker* w = Find(prefill)) {
    w->placed.insert(seq);
    w->prefills[seq] = {predicted_prefill_s, now};
  }
}

void ClusterView::PipelineStarted(uint64_t seq, const std::vector<std::string>& stages,
                                  double predicted_s, Clock::time_point now) {
  for (size_t i = 0; i < stages.size(); ++i) {
    Worker* w = Find(stages[i]);
    if (w == nullptr) continue;
    auto it = w->prefills.find(seq);
    const double alone = i == 0 && it != w->prefills.end() ? it->second.predicted_s : -1;
    w->prefills[seq] = {predicted_s * w->prefill_scale, now, alone};
  }
}

void ClusterView::PipelineEnded(uint64_t seq, const std::vector<std::string>& stages,
                                bool succeeded, Clock::time_point now) {
  for (size_t i = 1; i < stages.size(); ++i) {
    if (Worker* w = Find(stages[i]); w && w->prefills.erase(seq)) w->prefill_done_at = now;
  }
  if (succeeded || stages.empty()) return;
  Worker* first = Find(stages[0]);
  if (first == nullptr) return;
  auto it = first->prefills.find(seq);
  if (it != first->prefills.end() && it->second.alone_s >= 0) {
    it->second = {it->second.alone_s, now, -1};
  }
}

void ClusterView::Release(uint64_t seq, const std::string& decode, const std::string& prefill) {
  if (Worker* d = Find(decode)) {
    d->placed.erase(seq);
    d->decodes.erase(seq);
    d->promises.erase(seq);
    d->prefills.erase(seq);
  }
  if (Worker* w = prefill.empty() ? nullptr : Find(prefill)) {
    w->prefills.erase(seq);
    w->placed.erase(seq);
  }
}

}  // namespace tandem::conductor
