// Simulation: one request's events, from arrival through prefill, KV transfer and decode steps to
// its finish.
#include "sim/simulator_impl_internal.h"

namespace tandem::sim::internal {

void Simulation::OnArrival(int i) {
  Req& r = reqs_[i];
  std::string decode, prefill;
  const Placement p = PlaceNow(r, o_.placement.admission, &decode, &prefill);
  ++arrivals_;
  if (p.outcome == Placement::Outcome::kReject) {
    ++(p.reason == "ttft_slo" ? rejected_ttft_ : rejected_tbt_);
  }
  switch (p.outcome) {
    case Placement::Outcome::kNoWorker: Fail(r, 503, p.reason); return;
    case Placement::Outcome::kReject: Fail(r, 429, p.reason); return;
    case Placement::Outcome::kWait: EnterKvWait(i); return;
    case Placement::Outcome::kPlaced:
      Commit(r, p, decode, prefill);
      CheckTurn(i);
      return;
  }
}

void Simulation::EnterKvWait(int i) {
  Req& r = reqs_[i];
  if (!r.waited_kv) ++result_.kv_waits;
  r.waited_kv = r.waiting_kv = true;
  kv_waiting_.push_back(i);
  Push(r.deadline, EventKind::kWaitDeadline, i);
}

void Simulation::OnWaitDeadline(int i) {
  Req& r = reqs_[i];
  if (!r.waiting_kv || r.done) return;
  r.waiting_kv = false;
  kv_waiting_.erase(std::find(kv_waiting_.begin(), kv_waiting_.end(), i));
  Fail(r, 504, "kv_wait_deadline");
}

void Simulation::RetryKvWaiters() {
  std::vector<const Instance*> freed;
  for (int k : freed_) freed.push_back(instances_[k].get());
  freed_.clear();
  // Those waiting now, once each: one that fails again (its reservation refused) is back at
  // the end of the list for the next time.
  size_t left = kv_waiting_.size();
  for (auto it = kv_waiting_.begin(); it != kv_waiting_.end() && left > 0; --left) {
    const int i = *it;
    Req& r = reqs_[i];
    bool may_fit = false;
    for (const Instance* d : freed) {
      const int64_t hit = LeadingHeld(r.load.keys, MaxHitBlocks(r), d->view->reported_keys);
      const int need =
          conductor::DecodeBlocksNeeded(r.load.prompt_tokens, static_cast<int>(hit * bt_), bt_);
      if (need <= ClusterView::FreeBlocks(*d->view)) {
        may_fit = true;
        break;
      }
    }
    if (!may_fit) {
      ++it;
      continue;
    }
    std::string decode, prefill;
    const Placement p = PlaceNow(r, AdmissionPolicy::kNone, &decode, &prefill);
    if (p.outcome == Placement::Outcome::kWait) {
      ++it;
      continue;
    }
    it = kv_waiting_.erase(it);
    r.waiting_kv = false;
    if (p.outcome != Placement::Outcome::kPlaced) {
      Fail(r, 503, p.reason);
      continue;
    }
    Commit(r, p, decode, prefill);
    CheckTurn(i);
  }
}

void Simulation::CheckTurn(int i) {
  Req& r = reqs_[i];
  if (r.done || r.dispatched || r.waiting_kv) return;
  if (now_ >= r.deadline) {
    view_.Release(r.load.seq, r.decode_name, r.prefill_name);
    Fail(r, 504, "deadline");
    return;
  }
  const ClusterView::Worker* w = r.prefill >= 0 ? instances_[r.prefill]->view : nullptr;
  const double ahead = w ? ClusterView::QueueSeconds(*w, TimeAt(now_), r.load.seq) : 0;
  const double threshold = std::max(conductor::kDispatchAheadS, r.placement.predicted_prefill_s);
  if (ahead > threshold) {
    double next = ahead - threshold;
    if (o_.replace_interval_s > 0) {
      next = std::min(next, o_.replace_interval_s);
      Replace(r);
    }
    Push(now_ + std::max(1e-3, next), EventKind::kCheckTurn, i);
    return;
  }
  Instance& d = *instances_[r.decode];
  const int need =
      conductor::DecodeBlocksNeeded(r.load.prompt_tokens, r.placement.decode_cached_tokens, bt_);
  if (!view_.Dispatch(r.load.seq, r.decode_name, r.prefill_name, need, TimeAt(now_))) {
    view_.Release(r.load.seq, r.decode_name, r.prefill_name);
    EnterKvWait(i);
    return;
  }
  r.dispatched = true;
  r.dispatched_at = now_;
  // The decode worker answers a reservation between two steps of its loop.
  if (d.stepping) {
    d.pending_reservations.push_back(i);
    return;
  }
  ReserveAndStart(i, /*kick=*/true);
}

void Simulation::ReserveAndStart(int i, bool kick) {
  Req& r = reqs_[i];
  Instance& d = *instances_[r.decode];
  if (!Reserve(r, d)) {  // refused (429): back to waiting for room
    view_.Release(r.load.seq, r.decode_name, r.prefill_name);
    r.dispatched = false;
    EnterKvWait(i);
    return;
  }
  // The reservation is in the instance's figures at once: the promise is kept.
  d.view->promises.erase(r.load.seq);
  if (r.prefill < 0) {
    ++result_.local_prefills;
    r.rec.local = true;
    r.local_done = r.decode_hit_tokens;
    d.rec.cached_tokens += r.decode_hit_tokens;
    r.rec.cached_tokens = static_cast<int>(r.decode_hit_tokens);
    d.local.push_back(i);
    if (kick) Kick(d);
  } else {
    Instance& p = *instances_[r.prefill];
    p.queue.push_back(i);
    if (p.running < 0) StartNextPrefill(p);
  }
}

void Simulation::Replace(Req& r) {
  if (o_.placement.policy != conductor::PlacementPolicy::kCacheLoad) return;
  std::string decode, prefill;
  const Placement p = PlaceNow(r, AdmissionPolicy::kNone, &decode, &prefill);
  if (p.outcome != Placement::Outcome::kPlaced) return;
  if (decode == r.decode_name && prefill == r.prefill_name) return;
  view_.Release(r.load.seq, r.decode_name, r.prefill_name);
  Commit(r, p, decode, prefill);
}

bool Simulation::Reserve(Req& r, Instance& d) {
  const int64_t hit = d.cache->Hit(r.load.keys, MaxHitBlocks(r));
  const int64_t blocks = (r.load.prompt_tokens + 1 + bt_ - 1) / bt_;
  if (blocks > d.total_blocks - d.used_blocks) return false;
  for (int64_t b = 0; b < hit; ++b) d.cache->Erase(r.load.keys[b]);
  d.used_blocks += blocks;
  d.cache->ShrinkTo(d.total_blocks - d.used_blocks);
  r.reserved_blocks = blocks;
  r.decode_hit_tokens = hit * bt_;
  PublishKv(d);
  return true;
}

void Simulation::FreeReservation(Req& r) {
  if (r.reserved_blocks == 0 || r.decode < 0) return;
  Instance& d = *instances_[r.decode];
  d.used_blocks -= r.reserved_blocks;
  r.reserved_blocks = 0;
  freed_.insert(r.decode);  // waiters try again after this event
  // The prompt's full blocks stay cached, evictable.
  CachePrompt(r, d.cache.get());
  d.cache->ShrinkTo(d.total_blocks - d.used_blocks);
  PublishKv(d);
}

void Simulation::StartNextPrefill(Instance& p) {
  while (!p.queue.empty()) {
    const int i = p.queue.front();
    p.queue.pop_front();
    Req& r = reqs_[i];
    if (now_ >= r.deadline) {  // the worker refuses a request past its deadline
      view_.Release(r.load.seq, r.decode_name, r.prefill_name);
      FreeReservation(r);
      Fail(r, 504, "deadline");
      continue;
    }
    const int64_t local = p.cache->Hit(r.load.keys, MaxHitBlocks(r)) * bt_;
    // The pool's part beyond the local prefix is read over the instance's link first.
    const int64_t pooled = pool_ ? pool_->Hit(r.load.keys, MaxHitBlocks(r)) * bt_ : 0;
    const int64_t cached = std::max(local, pooled);
    const int64_t fetched = cached - local;
    const InstanceProfile& prof = o_.profile;
    const double fetch_s = fetched > 0 ? static_cast<double>(fetched) * prof.kv_bytes_per_token /
                                                 prof.link_bytes_per_s +
                                             prof.link_latency_s
                                       : 0.0;
    const int64_t n_new = r.load.prompt_tokens - cached;
    const double dt = o_.profile.cost.PrefillSeconds(n_new, cached) * Noise() + fetch_s;
    r.rec.cached_tokens = static_cast<int>(cached);
    r.rec.pool_tokens = static_cast<int>(fetched);
    p.rec.pool_tokens += fetched;
    r.prefill_started = now_;
    r.prefill_compute_s = dt;
    p.rec.prefill_tokens += n_new;
    p.rec.cached_tokens += cached;
    p.rec.steps++;
    AddBusy(p, now_, now_ + dt);
    p.running = i;
    Push(now_ + dt, EventKind::kPrefillEnd, by_name_.at(p.name));
    return;
  }
  p.running = -1;
}

void Simulation::OnPrefillEnd(int inst) {
  Instance& p = *instances_[inst];
  const int i = p.running;
  Req& r = reqs_[i];
  CachePrompt(r, p.cache.get());
  p.cache->ShrinkTo(o_.profile.PrefixCacheBlocks());
  if (pool_) {  // offered to the pool (least recently used out)
    CachePrompt(r, pool_.get());
    pool_->ShrinkTo(o_.pool_tokens / bt_);
  }
  // Layer-wise push: each layer's KV leaves as soon as it is computed; the link is shared
  // by this instance's transfers in order.
  const InstanceProfile& prof = o_.profile;
  const double bytes =
      static_cast<double>(r.load.prompt_tokens - r.decode_hit_tokens) * prof.kv_bytes_per_token;
  const double all_s = bytes / prof.link_bytes_per_s;
  const double start = std::max(r.prefill_started, p.nic_free_at);
  const double end = std::max(now_ + all_s / prof.layers, start + all_s);
  p.nic_free_at = end;
  r.transfer_s = end + prof.link_latency_s - now_;
  Push(end + prof.link_latency_s, EventKind::kKvArrived, i);
  StartNextPrefill(p);
}

void Simulation::OnKvArrived(int i) {
  Req& r = reqs_[i];
  view_.PrefillDone(r.load, r.prefill_name, r.decode_name, r.transfer_s, TimeAt(now_));
  FirstToken(i);
  Kick(*instances_[r.decode]);
}

void Simulation::FirstToken(int i) {
  Req& r = reqs_[i];
  r.first_token_at = r.last_token_at = now_;
  r.emitted = 1;
  view_.TokenEmitted(r.load.seq, r.decode_name);
  Instance& d = *instances_[r.decode];
  if (r.emitted >= r.load.max_tokens || now_ >= r.deadline) {
    Finish(i);
    return;
  }
  d.joining.push_back(i);
}

void Simulation::Kick(Instance& d) {
  if (d.stepping || (d.batch.empty() && d.joining.empty() && d.local.empty())) return;
  // Sequences join up to max_num_seqs; the rest wait for a place (in order).
  const size_t cap =
      o_.profile.max_num_seqs > 0 ? static_cast<size_t>(o_.profile.max_num_seqs) : SIZE_MAX;
  size_t joined = 0;
  while (joined < d.joining.size() && d.batch.size() < cap) d.batch.push_back(d.joining[joined++]);
  d.joining.erase(d.joining.begin(), d.joining.begin() + joined);
  const conductor::CostModel& c = o_.profile.cost;
  const int64_t batch = static_cast<int64_t>(d.batch.size());
  int64_t context = 0;
  for (int i : d.batch) context += reqs_[i].load.prompt_tokens + reqs_[i].emitted;
  int64_t budget = std::max<int64_t>(0, o_.profile.max_batch_tokens - batch);
  d.step_chunks.clear();
  std::vector<conductor::CostModel::Chunk> chunks;
  for (int i : d.local) {
    if (budget <= 0) break;
    Req& r = reqs_[i];
    const int64_t chunk = std::min<int64_t>(budget, r.load.prompt_tokens - r.local_done);
    if (chunk <= 0) continue;
    chunks.push_back({chunk, r.local_done});
    d.step_chunks.push_back({i, chunk});
    budget -= chunk;
    d.rec.prefill_tokens += chunk;
  }
  // One fused forward pass (CostModel::MixedStepSeconds, the mock worker's step time too).
  double dt = c.MixedStepSeconds(batch, context, chunks);
  if (batch > 0) dt += o_.profile.step_overhead_s;
  dt *= Noise();
  d.stepping = true;
  d.rec.steps++;
  AddBusy(d, now_, now_ + dt);
  Push(now_ + dt, EventKind::kStepEnd, by_name_.at(d.name));
}

void Simulation::OnStepEnd(int inst) {
  Instance& d = *instances_[inst];
  d.stepping = false;
  std::vector<int> still;
  still.reserve(d.batch.size());
  for (int i : d.batch) {
    Req& r = reqs_[i];
    const float gap = static_cast<float>(now_ - r.last_token_at);
    r.gaps.push_back(gap);
    r.last_token_at = now_;
    ++r.emitted;
    ++d.rec.decode_tokens;
    view_.TokenEmitted(r.load.seq, r.decode_name);
    // A new block when the sequence (prompt + generated, plus the next token) outgrows it.
    const int64_t need = (r.load.prompt_tokens + r.emitted + 1 + bt_ - 1) / bt_;
    if (need > r.reserved_blocks) {
      const int64_t more = need - r.reserved_blocks;
      d.cache->ShrinkTo(d.total_blocks - d.used_blocks - more);
      if (d.used_blocks + more > d.total_blocks) d.rec.kv_overflow_blocks += more;
      d.used_blocks += more;
      r.reserved_blocks = need;
      PublishKv(d);
    }
    if (r.emitted >= r.load.max_tokens || now_ >= r.deadline) {
      Finish(i);
    } else {
      still.push_back(i);
    }
  }
  d.batch.swap(still);
  for (const auto& [i, chunk] : d.step_chunks) {
    Req& r = reqs_[i];
    r.local_done += chunk;
    if (r.local_done < r.load.prompt_tokens) continue;
    d.local.erase(std::find(d.local.begin(), d.local.end(), i));
    r.transfer_s = 0;
    view_.PrefillDone(r.load, "", r.decode_name, -1, TimeAt(now_));
    FirstToken(i);
  }
  d.step_chunks.clear();
  std::vector<int> pending;
  pending.swap(d.pending_reservations);
  for (int i : pending) ReserveAndStart(i, /*kick=*/false);
  Kick(d);
}

void Simulation::Finish(int i) {
  Req& r = reqs_[i];
  const bool deadline_hit = r.emitted < r.load.max_tokens;
  RequestRecord& rec = r.rec;
  rec.output_tokens = r.emitted;
  // The first token's delivery to the client (front door, relays) is not engine time.
  rec.ttft_s = r.first_token_at - r.in->arrival_s + o_.profile.ttft_overhead_s;
  rec.e2e_s = now_ - r.in->arrival_s;
  rec.prefill = r.prefill_name;
  rec.decode = r.decode_name;
  rec.predicted_tbt_s = r.placement.predicted_tbt_s;
  rec.kv_wait_s = r.committed_at - r.in->arrival_s;
  rec.hold_s = r.dispatched_at - r.committed_at;
  if (r.prefill >= 0) {
    rec.queue_s = r.prefill_started - r.dispatched_at;
    rec.prefill_s = r.prefill_compute_s;
    rec.transfer_s = r.transfer_s;
  } else {
    rec.prefill_s = r.first_token_at - r.dispatched_at;  // chunks in the decode steps
  }
  // Predicted from its (last) placement, counted here from its arrival.
  rec.predicted_ttft_s = r.placement.predicted_ttft_s + (r.committed_at - r.in->arrival_s);
  if (!r.gaps.empty()) {
    std::vector<float> g = r.gaps;
    const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(0.1 * g.size())));
    std::partial_sort(g.begin(), g.begin() + k, g.end(), std::greater<float>());
    double top = 0, sum = 0;
    for (size_t j = 0; j < k; ++j) top += g[j];
    for (float x : r.gaps) sum += x;
    rec.tbt_s = top / k;
    rec.mean_gap_s = sum / r.gaps.size();
    rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (r.emitted - 1);
    result_.gaps_s.insert(result_.gaps_s.end(), r.gaps.begin(), r.gaps.end());
    if (o_.keep_gaps) rec.gaps_s = r.gaps;
  }
  r.gaps.clear();
  r.gaps.shrink_to_fit();
  r.done = true;
  rec.ok = !deadline_hit;
  rec.status = deadline_hit ? 504 : 200;
  if (deadline_hit) rec.error = "deadline";
  // The conductor learns from what it measured (conductor_request.cc's Finish).
  expected_output_ = 0.9 * expected_output_ + 0.1 * r.emitted;
  if (rec.mean_gap_s > 0)
    view_.DecodeMeasured(r.decode_name, r.placement.predicted_tbt_s, rec.mean_gap_s);
  if (r.prefill >= 0) {
    view_.PrefillMeasured(r.prefill_name, r.load.prompt_tokens - r.rec.cached_tokens,
                          r.rec.cached_tokens, r.prefill_compute_s);
  }
  view_.Release(r.load.seq, r.decode_name, r.prefill_name);
  FreeReservation(r);
}

}  // namespace tandem::sim::internal
