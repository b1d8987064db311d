// LocalBackendImpl: one engine step (plan, forward, sample, stream), reaping, published stats.
#include "serving/local_backend_impl_internal.h"

namespace tandem::serving::internal {

void LocalBackendImpl::Step() {
  struct Planned {
    Sequence* seq;
    int n;
  };
  std::vector<Planned> plan;
  int budget = options_.max_batch_tokens;
  // Rows of prompt logprobs left in this step (each is a vocab-wide row of logits; the
  // memory plan bounds them, engine/memory_plan.h).
  int logprob_rows = engine::kPromptLogprobRowsPerStep;
  // Decodes first (one token each, they hold the TBT), then prefill chunks in arrival order.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence* s = running_[i].get();
      if (s->finish || (pass == 0) != (s->pending() == 1) || budget == 0) continue;
      int n = std::min(s->pending(), budget);
      const bool all_logits = WantsPromptLogprobs(*s) && s->n_computed < s->n_prompt;
      if (all_logits) {
        if (logprob_rows == 0) continue;
        n = std::min(n, logprob_rows);
      }
      // Short of blocks: preempt the newest other sequences (the victim is always after
      // `s` in running_ unless `s` is last, so the indices before i stay valid).
      bool reserved = ReserveStep(*s, n);
      while (!reserved && PreemptOne(s)) reserved = ReserveStep(*s, n);
      if (!reserved && KvHeldByOthers(*s)) {
        // What it lacks is held by reservations, sequences waiting with their KV or finished
        // ones: they give it back without `s`, so `s` waits for it (preempted itself).
        s->waits_for_kv = true;
        Preempt(i--);  // running_[i] is now the next sequence (i wraps to -1 at 0: fine)
        continue;
      }
      if (!reserved) {
        SetFinish(*s, FinishReason::kError, "the KV cache cannot hold this sequence");
        continue;
      }
      plan.push_back({s, n});
      budget -= n;
      if (all_logits) logprob_rows -= n;
    }
  }
  // Preemption may have removed planned sequences from running_: keep only live ones.
  std::erase_if(plan, [&](const Planned& p) {
    return std::none_of(running_.begin(), running_.end(),
                        [&](const auto& r) { return r.get() == p.seq; });
  });
  if (plan.empty()) {
    ReapFinished();
    return;
  }
  std::vector<engine::BatchItem> items;
  items.reserve(plan.size());
  for (const auto& p : plan) {
    Sequence& s = *p.seq;
    const bool last = s.n_computed + p.n == static_cast<int>(s.tokens.size());
    items.push_back({s.blocks, s.n_computed, std::span(s.tokens).subspan(s.n_computed, p.n), last,
                     WantsPromptLogprobs(s) && s.n_computed < s.n_prompt});
  }
  // Observers (prefill side of disaggregation) see each layer as soon as it is written.
  std::vector<std::pair<KvObserver*, size_t>> observed;  // observer, plan index
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].seq->observer) observed.emplace_back(plan[i].seq->observer.get(), i);
  }
  if (!observed.empty()) {
    engine_->transformer().SetLayerDoneCallback([&](int layer) {
      for (const auto& [obs, i] : observed) {
        const Sequence& s = *plan[i].seq;
        obs->OnLayerWritten(layer, s.blocks, s.n_computed, s.n_computed + plan[i].n);
      }
    });
  }
  const Clock::time_point forward_start = Clock::now();
  Status st = engine_->transformer().Forward(items, kv_, &logits_);
  CountBusy(plan, Clock::now() - forward_start);
  if (!observed.empty()) engine_->transformer().SetLayerDoneCallback(nullptr);
  if (!st.ok()) {
    log_->error("forward step failed: {}", st.ToString());
    for (const auto& p : plan) SetFinish(*p.seq, FinishReason::kError, st.message());
    ReapFinished();
    return;
  }
  // Draw every sequence's token on the engine's threads (each sampler is its own sequence's;
  // a draw reads only its row of logits), then hand them out in plan order.
  // Rows of logits: one per item that wants them, n for an item with all_logits (its last row
  // is the one to draw from); first_row[i] is item i's first.
  const int vocab = engine_->config().vocab_size;
  std::vector<size_t> first_row(plan.size());
  std::vector<Sequence*> drawing;
  std::vector<size_t> drawing_row;
  for (size_t i = 0, r = 0; i < plan.size(); ++i) {
    first_row[i] = r;
    r += items[i].all_logits ? items[i].tokens.size() : (items[i].want_logits ? 1 : 0);
    // A request for prompt logprobs only (max_tokens 0) draws nothing.
    if (items[i].want_logits && plan[i].seq->req.max_tokens > 0) {
      drawing.push_back(plan[i].seq);
      drawing_row.push_back(r - 1);
    }
  }
  std::vector<engine::SampledToken> drawn(drawing.size());
  const Clock::time_point sample_start = Clock::now();
  engine_->pool().ParallelFor(static_cast<int64_t>(drawing.size()), [&](int64_t begin, int64_t end,
                                                                        int) {
    for (int64_t r = begin; r < end; ++r) {
      drawn[r] =
          drawing[r]->sampler->Sample(std::span(logits_).subspan(drawing_row[r] * vocab, vocab));
    }
  });
  const Clock::duration sampling = Clock::now() - sample_start;
  sampling_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(sampling).count());
  size_t row = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    if (items[i].all_logits) CollectPromptLogprobs(s, items[i], &logits_[first_row[i] * vocab]);
    s.n_computed += plan[i].n;
    if (s.n_computed <= s.n_prompt) prompt_tokens_.fetch_add(plan[i].n);
    if (!s.prompt_offered && s.n_computed >= s.n_prompt) {
      s.prompt_offered = true;
      OfferBlocks(s);
    }
    TrimWindow(s);
    if (WantsPromptLogprobs(s) && s.n_computed >= s.n_prompt) {
      s.prompt_lp_sent = true;
      s.sink->OnPromptLogprobs(std::move(s.prompt_lp));
      s.prompt_lp.clear();
    }
    if (!items[i].want_logits) continue;
    if (s.req.max_tokens == 0) {  // prompt logprobs only
      SetFinish(s, FinishReason::kLength);
      continue;
    }
    const engine::SampledToken& sampled = drawn[row++];
    const int32_t tok = sampled.token;
    s.tokens.push_back(tok);
    ++s.n_generated;
    generated_tokens_.fetch_add(1);
    if (s.n_generated == static_cast<int>(s.req.resumed_output.size()) + 1) {
      s.first_token = Clock::now();
    }
    if (!s.sink->OnToken(sampled)) {
      SetFinish(s, FinishReason::kCancelled, "cancelled by the client");
    } else if (EndsGeneration(s.req, tok, engine_->tokenizer().IsEndOfGeneration(tok)) ||
               s.sampler->ConstraintFinished()) {
      SetFinish(s, FinishReason::kStop);
    } else if (s.n_generated >= s.req.max_tokens ||
               static_cast<int>(s.tokens.size()) >= engine_->config().context_length) {
      SetFinish(s, FinishReason::kLength);
    }
  }
  // A mock engine's step time includes drawing and handing out the tokens, as a GPU engine's
  // does (its host work overlaps the device's next step).
  engine_->transformer().CreditMockHostSeconds(
      std::chrono::duration<double>(Clock::now() - sample_start).count());
  ReapFinished();
}

bool LocalBackendImpl::WantsPromptLogprobs(const Sequence& s) {
  return s.req.sampling.prompt_logprobs >= 0 && !s.prompt_lp_sent;
}

void LocalBackendImpl::CollectPromptLogprobs(Sequence& s, const engine::BatchItem& item,
                                             const float* rows) {
  const int vocab = engine_->config().vocab_size;
  for (size_t j = 0; j < item.tokens.size(); ++j) {
    const int next = item.start_pos + static_cast<int>(j) + 1;
    if (next >= s.n_prompt) break;
    // Entry k scores prompt token k + 1; a recomputed prefix (after preemption) has its own.
    if (static_cast<size_t>(next - 1) != s.prompt_lp.size()) continue;
    s.prompt_lp.push_back(engine::LogprobsOf(std::span(rows + j * vocab, vocab), s.tokens[next],
                                             s.req.sampling.prompt_logprobs));
  }
}

void LocalBackendImpl::ReapFinished() {
  auto reap = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      Sequence& s = **it;
      if (!s.finish) {
        ++it;
        continue;
      }
      OfferBlocks(s);
      const auto now = Clock::now();
      FinishInfo info;
      info.reason = *s.finish;
      info.message = s.finish_message;
      info.prompt_tokens = s.n_prompt;
      info.completion_tokens = s.n_generated;
      info.cached_prompt_tokens = s.cached_tokens;
      info.queue_seconds = s.admitted_once ? SecondsBetween(s.req.arrival, s.first_scheduled)
                                           : SecondsBetween(s.req.arrival, now);
      info.ttft_seconds = s.n_generated > 0 ? SecondsBetween(s.req.arrival, s.first_token) : 0;
      info.total_seconds = SecondsBetween(s.req.arrival, now);
      s.sink->OnFinish(info);
      OfferToPool(s);  // after the sink heard: a request does not wait for the pool
      kv_.Release(s.blocks);
      s.blocks.clear();
      it = list.erase(it);
    }
  };
  reap(running_);
  reap(waiting_);
}

void LocalBackendImpl::PublishStats() {
  running_count_.store(static_cast<int>(running_.size()));
  if (prefix_cache_.version() != published_keys_version_) {  // copy only what changed
    published_keys_version_ = prefix_cache_.version();
    auto keys = prefix_cache_.Keys();
    MutexLock lock(&keys_mu_);
    cached_keys_ = std::move(keys);
  }
  const int cached = prefix_cache_.UnsharedBlocks();
  kv_cached_.store(cached);
  kv_used_.store(kv_.num_blocks() - kv_.num_free() - cached);
  kv_window_used_.store(kv_.num_window_blocks() - kv_.num_free_window());
  int reserved = 0;
  for (const auto& [id, r] : reservations_) reserved += static_cast<int>(r.blocks.size());
  reserved_blocks_.store(reserved);
  MutexLock lock(&mu_);
  waiting_count_.store(static_cast<int>(waiting_.size() + inbox_.size()));
}

}  // namespace tandem::serving::internal
