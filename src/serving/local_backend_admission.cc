// LocalBackendImpl: the loop, deadlines, KV reservation for steps, admission and preemption.
#include "serving/local_backend_impl_internal.h"

namespace tandem::serving::internal {

void LocalBackendImpl::Loop() {
  std::vector<std::function<void()>> commands;
  while (true) {
    {
      MutexLock lock(&mu_);
      idle_ = running_.empty() && waiting_.empty() && inbox_.empty() && reservations_.empty();
      if (idle_) idle_cv_.NotifyAll();
      // Sleeps until work arrives, or until the earliest reservation expires. Waiting
      // requests that could not be admitted, with nothing running, are retried every
      // kStalledRetry rather than in a busy loop (memory comes back with a command, a
      // reservation's expiry or a deadline).
      const Clock::time_point wake =
          admission_stalled_ ? std::min(NextReservationExpiry(), Clock::now() + kStalledRetry)
                             : NextReservationExpiry();
      cv_.WaitUntil(&mu_, wake, [&] {
        mu_.AssertHeld();
        return stop_ || !inbox_.empty() || !running_.empty() ||
               (!waiting_.empty() && !admission_stalled_) || !commands_.empty() ||
               ReservationDue() || (admission_stalled_ && Clock::now() >= wake);
      });
      for (auto& s : inbox_) waiting_.push_back(std::move(s));
      inbox_.clear();
      commands.swap(commands_);
      if (stop_ || (draining_ && Clock::now() >= drain_deadline_)) {
        const bool stopping = stop_;  // stop_ is guarded: read it before unlocking
        mu_.Unlock();
        CancelAll(stopping ? "the server stopped" : "the shutdown deadline passed");
        mu_.Lock();
        if (stop_) {
          idle_ = true;
          idle_cv_.NotifyAll();
          return;
        }
        continue;
      }
    }
    for (auto& fn : commands) fn();
    commands.clear();
    ExpireDeadlines();
    Admit();
    admission_stalled_ = running_.empty() && !waiting_.empty();
    PublishStats();  // before the step, so that Submit sees the admissions at once
    if (!running_.empty()) Step();
    PublishStats();
  }
}

void LocalBackendImpl::CancelAll(const std::string& why) {
  for (auto& [id, r] : reservations_) kv_.Release(r.blocks);
  reservations_.clear();
  for (auto& s : running_) SetFinish(*s, FinishReason::kCancelled, why);
  for (auto& s : waiting_) SetFinish(*s, FinishReason::kCancelled, why);
  ReapFinished();
  PublishStats();
}

void LocalBackendImpl::SetFinish(Sequence& s, FinishReason r, std::string message) {
  if (!s.finish) {
    s.finish = r;
    s.finish_message = std::move(message);
  }
}

void LocalBackendImpl::ExpireDeadlines() {
  const auto now = Clock::now();
  auto expire = [&](auto& list) {
    for (auto& s : list) {
      if (now >= s->req.deadline) SetFinish(*s, FinishReason::kTimeout, kRequestDeadlinePassed);
    }
  };
  expire(running_);
  expire(waiting_);
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (now >= it->second.expires) {
      log_->warn("KV reservation '{}' expired unclaimed; {} blocks freed", it->first,
                 it->second.blocks.size());
      kv_.Release(it->second.blocks);
      reservations_expired_.fetch_add(1);
      it = reservations_.erase(it);
    } else {
      ++it;
    }
  }
  ReapFinished();
}

bool LocalBackendImpl::Reserve(Sequence& s, int64_t n_tokens) {
  const int need = kv_.BlocksFor(n_tokens) - static_cast<int>(s.blocks.size());
  if (need <= 0) return true;
  if (kv_.num_free() < need) prefix_cache_.Evict(need - kv_.num_free());
  auto got = kv_.Allocate(need);
  if (!got.ok()) return false;
  s.blocks.insert(s.blocks.end(), got->begin(), got->end());
  return true;
}

bool LocalBackendImpl::ReserveStep(Sequence& s, int n) {
  return Reserve(s, s.n_computed + n) &&
         AttachWindow(s.blocks, s.n_computed, s.n_computed + n).ok();
}

Status LocalBackendImpl::AttachWindow(std::span<const int32_t> table, int64_t first_pos,
                                      int64_t end_pos) {
  Status st = kv_.AttachWindow(table, first_pos, end_pos);
  if (st.code() != StatusCode::kResourceExhausted) return st;
  auto missing = [&] {
    return kv_.MissingWindows(table, first_pos, end_pos) - kv_.num_free_window();
  };
  prefix_cache_.EvictWindows(missing());
  if (missing() > 0) {
    prefix_cache_.UnpinWindows();
    for (auto& s : running_) TrimWindow(*s);
    prefix_cache_.EvictWindows(missing());
  }
  return kv_.AttachWindow(table, first_pos, end_pos);
}

void LocalBackendImpl::TrimWindow(Sequence& s) {
  kv_.TrimWindow(s.blocks, s.n_computed, [this](int32_t b) {
    return prefix_cache_.Holds(b) && !prefix_cache_.PinsWindow(b) ? 1 : 0;
  });
}

void LocalBackendImpl::Admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    // Prompt logprobs need every prompt position computed: no cached prefix then.
    const bool matched =
        options_.enable_prefix_cache && s.blocks.empty() && !WantsPromptLogprobs(s);
    if (matched) {
      // Reuse cached full blocks, leaving at least one token to compute (it yields logits).
      const int max_blocks = static_cast<int>((s.tokens.size() - 1) / block_tokens_);
      s.blocks = prefix_cache_.Match(KeysOf(s, s.tokens.size()), max_blocks);
      s.n_computed = static_cast<int>(s.blocks.size()) * block_tokens_;
    }
    // A sequence that gave its KV up for others' (Step) comes back only when its next step
    // fits, window storage included; else it would be admitted and give it up again at once.
    const int64_t first_step =
        std::min<int64_t>(s.n_computed + options_.max_batch_tokens, s.tokens.size());
    if (!Reserve(s, static_cast<int64_t>(s.tokens.size())) ||
        (s.waits_for_kv && !AttachWindow(s.blocks, s.n_computed, first_step).ok())) {
      // Not enough memory now: keep what it computed as prefix cache (e.g. KV a prefill
      // worker pushed) and its blocks out of the way, let waiting sequences that already
      // hold their KV run if they fit (they may be what holds the memory), and wait.
      OfferBlocks(s);
      kv_.Release(s.blocks);
      s.blocks.clear();
      s.n_computed = 0;
      AdmitHoldersBehind();
      break;
    }
    // Then what the KV pool holds of the rest, read into the blocks just reserved (so a
    // sequence waiting for memory does not read the pool again and again).
    const int from_cache = s.n_computed;
    if (matched && UsesPool() && FetchPaysOff()) FetchFromPool(s);
    if (s.preempted_tokens > 0) CountResumed(s, from_cache);
    s.waits_for_kv = false;
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.cached_tokens = s.n_computed;
      s.first_scheduled = Clock::now();
      cache_hit_tokens_.fetch_add(s.n_computed);
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void LocalBackendImpl::CountResumed(Sequence& s, int from_cache) {
  const int cache = std::min(from_cache, s.preempted_tokens);
  const int pool = std::min(s.n_computed, s.preempted_tokens) - cache;
  preempt_resumed_cache_.fetch_add(cache);
  preempt_resumed_pool_.fetch_add(pool);
  preempt_recomputed_.fetch_add(s.preempted_tokens - cache - pool);
  s.preempted_tokens = 0;
}

void LocalBackendImpl::AdmitHoldersBehind() {
  for (size_t i = 1;
       i < waiting_.size() && static_cast<int>(running_.size()) < options_.max_num_seqs;) {
    Sequence& w = *waiting_[i];
    if (w.blocks.empty() || !Reserve(w, static_cast<int64_t>(w.tokens.size()))) {
      ++i;
      continue;
    }
    running_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

bool LocalBackendImpl::PreemptOne(const Sequence* keep) {
  for (size_t i = running_.size(); i-- > 0;) {
    const Sequence& s = *running_[i];
    if (&s == keep || s.finish) continue;
    Preempt(i);
    return true;
  }
  return false;
}

bool LocalBackendImpl::KvHeldByOthers(const Sequence& s) const {
  if (!reservations_.empty()) return true;
  for (const auto& w : waiting_) {
    if (!w->blocks.empty()) return true;
  }
  for (const auto& r : running_) {
    if (r.get() != &s && !r->blocks.empty()) return true;
  }
  return false;
}

void LocalBackendImpl::Preempt(size_t index) {
  Sequence& s = *running_[index];
  // Its KV stays in the prefix cache (until evicted) and goes to the KV pool, from where
  // it resumes when a fetch is measured cheaper than recomputing (FetchPaysOff,
  // docs/design/engine.md).
  OfferBlocks(s);
  const int pool_had = s.pool_known;
  OfferToPool(s);
  preempt_offloaded_.fetch_add(int64_t{s.pool_known - pool_had} * block_tokens_);
  s.preempted_tokens = s.n_computed;
  kv_.Release(s.blocks);
  s.blocks.clear();
  s.n_computed = 0;
  waiting_.push_front(std::move(running_[index]));
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  preemptions_.fetch_add(1);
  log_->info("preempted {} at {} tokens (KV cache full){}", waiting_.front()->req.id,
             waiting_.front()->preempted_tokens, UsesPool() ? "; its KV went to the pool" : "");
}

}  // namespace tandem::serving::internal
