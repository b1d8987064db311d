// ConductorImpl: the pool's answer, block keys, placement, waiting for a prefill turn.
#include "conductor/conductor_impl_internal.h"

namespace tandem::conductor::internal {

void ConductorImpl::AskPool(RequestRun* run) {
  const std::vector<int32_t>& prompt = run->r.prompt_tokens;
  if (!options_.pool_aware || !pool_directory_ || prompt.size() < 2) return;
  std::string ns;
  int bt = 0;
  int window = 0;  // sliding-window models: the window, in tokens
  {
    MutexLock lock(&mu_);
    for (const auto& [name, w] : view_.workers()) {
      if (w.healthy && w.stats.pool_enabled && !w.stats.pool_namespace.empty() &&
          w.info.role == cluster::Role::kPrefill && w.info.block_tokens > 0) {
        ns = w.stats.pool_namespace;
        bt = w.info.block_tokens;
        for (int lw : w.info.layer_windows) window = std::max(window, lw);
        break;
      }
    }
  }
  if (ns.empty()) return;
  run->load.keys = serving::BlockKeys(prompt, bt);
  run->load.block_tokens = bt;
  const std::vector<uint64_t>& keys = run->load.keys;
  const size_t usable = std::min(keys.size(), (prompt.size() - 1) / static_cast<size_t>(bt));
  std::vector<std::string> objects;
  for (size_t i = 0; i < usable; ++i) objects.push_back(store::ObjectKey(ns, keys[i]));
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(100);
  auto held = pool_directory_->HeldPrefix(objects, deadline);
  metrics_.pool_lookups.fetch_add(1);
  if (held.ok() && *held > 0 && window > 0) held = ResumableInPool(keys, *held, ns, bt, window);
  if (!held.ok()) {
    metrics_.pool_lookup_failures.fetch_add(1);
    return;
  }
  metrics_.pool_predicted_tokens.fetch_add(int64_t{*held} * bt);
  run->load.pool_prompt_tokens = *held * bt;
}

StatusOr<int> ConductorImpl::ResumableInPool(const std::vector<uint64_t>& keys, int held,
                                             const std::string& ns, int bt, int window) {
  // The worker reads a prefix only up to an end whose windows the pool holds (serving::KvPool);
  // ends are looked for among the last few windows' blocks before `held`.
  const int window_blocks = (window + bt - 1) / bt + 1;
  const int lo = std::max(0, held - 4 * window_blocks);
  std::vector<std::string> objects;
  const std::string window_ns = store::WindowNamespace(ns);
  for (int i = lo; i < held; ++i) objects.push_back(store::ObjectKey(window_ns, keys[i]));
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<bool> windows,
      pool_directory_->Held(objects, Clock::now() + std::chrono::milliseconds(100)));
  return serving::ResumableEnd(windows, lo, 0, held, bt, window);
}

void ConductorImpl::KeysFor(RequestRun* run) {
  int bt = 0;
  for (const auto& [name, w] : view_.workers()) {
    if (w.info.block_tokens > 0) {
      bt = w.info.block_tokens;
      break;
    }
  }
  if (bt <= 0 || bt == run->load.block_tokens) return;
  run->load.block_tokens = bt;
  run->load.keys = serving::BlockKeys(run->r.prompt_tokens, bt);
}

RequestShape ConductorImpl::ShapeOf(const RequestRun& run) const {
  RequestShape shape;
  shape.prompt_tokens = run.load.prompt_tokens;
  shape.max_tokens = run.load.max_tokens;
  shape.expected_output_tokens = std::min(run.load.max_tokens, ExpectedOutputLocked());
  shape.slo_ttft_s = run.slo_ttft_s;
  shape.slo_tbt_s = run.slo_tbt_s;
  return shape;
}

int ConductorImpl::ExpectedOutputLocked() const {
  return std::max(1, static_cast<int>(expected_output_));
}

Placement ConductorImpl::PlaceLocked(const RequestRun& run, AdmissionPolicy admission,
                                     std::span<const std::string> exclude_prefill,
                                     std::string* decode, std::string* prefill) {
  const auto now = Clock::now();
  const auto snapshot = view_.Snapshot(run.load, now, &names_scratch_);
  std::vector<int> exclude;
  for (size_t i = 0; i < names_scratch_.size(); ++i) {
    if (std::find(exclude_prefill.begin(), exclude_prefill.end(), names_scratch_[i]) !=
        exclude_prefill.end()) {
      exclude.push_back(static_cast<int>(i));
    }
  }
  PlacementOptions po;
  po.policy = options_.placement;
  po.admission = admission;
  po.allow_local_prefill = options_.local_prefill;
  po.random_draw = rng_();
  Placement p = Place(snapshot, ShapeOf(run), po, exclude);
  *decode = p.decode >= 0 ? names_scratch_[p.decode] : std::string();
  *prefill = p.prefill >= 0 && !p.local ? names_scratch_[p.prefill] : std::string();
  if (log_->should_log(spdlog::level::debug)) {
    std::string queues;
    for (const auto& w : snapshot) {
      queues += fmt::format(" {}:queue={:.3f}s,cached={},decoding={}", w.name, w.prefill_queue_s,
                            w.cached_prompt_tokens, w.decoding.size());
    }
    log_->debug("{} placed: outcome={} decode={} prefill={} local={} ttft={:.3f}s tbt={:.4f}s{}",
                run.r.id, static_cast<int>(p.outcome), *decode, *prefill, p.local,
                p.predicted_ttft_s, p.predicted_tbt_s, queues);
  }
  return p;
}

bool ConductorImpl::PlaceForRun(RequestRun* run, bool first, bool force_local, bool resume) {
  MutexLock lock(&mu_);
  KvWait wait(this, run);
  // The decode worker computes the prompt itself: no prefill worker.
  auto make_local = [run](Placement& p) {
    p.local = true;
    p.prefill = -1;
    run->prefill.clear();
  };
  while (true) {
    Placement p;
    if (first) {
      p = run->placement;
    } else if (resume) {
      p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &run->decode, &run->prefill);
      make_local(p);
    } else if (force_local) {
      // The same decode worker computes the prompt itself (it was chosen for this request
      // and answered; a heartbeat may not have seen it since a stall).
      p = run->placement;
      make_local(p);
    } else {
      p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &run->decode, &run->prefill);
    }
    if (run->r.sampling.prompt_logprobs >= 0 && p.outcome == Placement::Outcome::kPlaced &&
        !p.local) {
      // Prompt logprobs come from the worker that computes the prompt with every position's
      // logits: the decode worker does it (the prefill hand-off carries no prompt logits).
      make_local(p);
    }
    first = false;
    if (p.outcome == Placement::Outcome::kPlaced) {
      run->placement = p;
      run->committed_at = Clock::now();
      view_.Commit(run->load, p, run->decode, run->prefill, ExpectedOutputLocked(),
                   run->committed_at);
      return true;
    }
    if (p.outcome == Placement::Outcome::kNoWorker && !resume) {
      run->error = Unavailable(p.message);
      return false;
    }
    if (p.outcome != Placement::Outcome::kNoWorker) wait.Start();  // kWait: no KV room now
    if (stop_ || cancel_all_.load()) {
      run->error = Cancelled("the server stopped");
      return false;
    }
    if (Clock::now() >= run->r.deadline) {
      run->error = DeadlineExceeded(
          p.outcome == Placement::Outcome::kNoWorker
              ? "no decode worker came back to continue the stream before the request deadline"
              : "no decode worker had room for the prompt's KV cache before the request "
                "deadline");
      return false;
    }
    // Room appears when a request ends (notified) or a heartbeat shows evictable blocks.
    cv_.WaitUntil(&mu_, std::min(run->r.deadline, Clock::now() + std::chrono::milliseconds(100)));
  }
}

bool ConductorImpl::WaitForPrefillTurn(RequestRun* run, bool may_replace) {
  MutexLock lock(&mu_);
  KvWait wait(this, run);
  while (true) {
    const auto now = Clock::now();
    const ClusterView::Worker* w = run->prefill.empty() ? nullptr : view_.Find(run->prefill);
    const double ahead = w ? ClusterView::QueueSeconds(*w, now, run->load.seq) : 0;
    if (ahead <= std::max(kDispatchAheadS, run->placement.predicted_prefill_s)) {
      const ClusterView::Worker* d = view_.Find(run->decode);
      const int need =
          DecodeBlocksNeeded(run->load.prompt_tokens, run->placement.decode_cached_tokens,
                             d ? d->info.block_tokens : 0);
      if (view_.Dispatch(run->load.seq, run->decode, run->prefill, need, now)) return true;
      wait.Start();  // its turn, but no KV room on the decode worker now
    }
    if (stop_ || cancel_all_.load()) {
      run->error = Cancelled("the server stopped");
      return false;
    }
    if (now >= run->r.deadline) {
      run->error = DeadlineExceeded(
          wait.counted() ? "no decode worker had room for the prompt's KV cache before the "
                           "request deadline"
                         : serving::kRequestDeadlinePassed);
      return false;
    }
    cv_.WaitUntil(&mu_, std::min(run->r.deadline, now + std::chrono::milliseconds(50)));
    if (!may_replace || options_.placement != PlacementPolicy::kCacheLoad) continue;
    std::string decode, prefill;
    const Placement p = PlaceLocked(*run, AdmissionPolicy::kNone, {}, &decode, &prefill);
    if (p.outcome != Placement::Outcome::kPlaced) continue;  // keep the current one
    if (decode == run->decode && prefill == run->prefill) continue;
    view_.Release(run->load.seq, run->decode, run->prefill);
    run->placement = p;
    run->decode = decode;
    run->prefill = prefill;
    run->committed_at = Clock::now();
    view_.Commit(run->load, p, run->decode, run->prefill, ExpectedOutputLocked(),
                 run->committed_at);
  }
}

}  // namespace tandem::conductor::internal
