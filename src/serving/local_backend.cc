#include "serving/local_backend.h"

#include "serving/local_backend_impl_internal.h"

namespace tandem::serving {
namespace internal {

LocalBackendImpl::LocalBackendImpl(engine::Engine* engine, const SchedulerOptions& options)
    : LocalBackend(engine),
      options_(options),
      kv_(engine->kv()),
      block_tokens_(kv_.shape().block_tokens),
      prefix_cache_(&kv_),
      end_tokens_(engine->tokenizer().EndOfGenerationIds()),
      log_(GetLogger("scheduler")) {
  engine_threads_.store(engine->threads());
  options_.max_batch_tokens = std::max(options_.max_batch_tokens, options_.max_num_seqs);
  engine::MemoryPlanInputs plan_in;
  plan_in.model_file_bytes = static_cast<int64_t>(engine->model_bytes());
  plan_in.engine = engine->options();
  plan_in.engine.kv_capacity_tokens = kv_.num_blocks() * block_tokens_;
  plan_in.engine.max_sequences = options_.max_num_seqs;
  plan_in.engine.max_step_tokens = options_.max_batch_tokens;
  plan_in.kv_pool_bytes = options_.kv_pool_bytes;
  memory_plan_ = engine::PlanMemory(engine->config(), plan_in);
  loop_ = std::thread([this] { Loop(); });
}

LocalBackendImpl::~LocalBackendImpl() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  loop_.join();
}

Status LocalBackendImpl::Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) {
  return SubmitObserved(std::move(request), std::move(sink), nullptr);
}

Status LocalBackendImpl::SubmitObserved(GenerationRequest request,
                                        std::shared_ptr<GenerationSink> sink,
                                        std::shared_ptr<KvObserver> observer) {
  TANDEM_RETURN_IF_ERROR(Validate(request));
  TANDEM_ASSIGN_OR_RETURN(auto seq, NewSequence(std::move(request), std::move(sink)));
  seq->observer = std::move(observer);
  MutexLock lock(&mu_);
  TANDEM_RETURN_IF_ERROR(CheckAcceptingLocked());
  inbox_.push_back(std::move(seq));
  waiting_count_.fetch_add(1);
  idle_ = false;
  cv_.NotifyAll();
  return OkStatus();
}

StatusOr<LocalBackend::Reserved> LocalBackendImpl::ReserveBlocks(const std::string& id,
                                                                 int n_tokens,
                                                                 Clock::time_point expires) {
  return Reserve(id, {}, n_tokens, expires);
}

StatusOr<LocalBackend::Reserved> LocalBackendImpl::ReservePrompt(const std::string& id,
                                                                 std::span<const int32_t> prompt,
                                                                 int n_tokens,
                                                                 Clock::time_point expires) {
  return Reserve(id, std::vector<int32_t>(prompt.begin(), prompt.end()), n_tokens, expires);
}

std::vector<uint64_t> LocalBackendImpl::CachedBlockKeys() const {
  MutexLock lock(&keys_mu_);
  return cached_keys_;
}

Status LocalBackendImpl::SubmitPrefilled(GenerationRequest request, int32_t first_token,
                                         std::shared_ptr<GenerationSink> sink) {
  TANDEM_RETURN_IF_ERROR(Validate(request));
  if (first_token < 0 || first_token >= engine_->config().vocab_size) {
    return InvalidArgument("first token outside the vocabulary");
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> shared,
                          NewSequence(std::move(request), std::move(sink)));
  auto st = RunOnLoop<bool>([this, shared, first_token]() -> StatusOr<bool> {
    Sequence& s = *shared;
    auto it = reservations_.find(s.req.id);
    if (it == reservations_.end()) {
      return NotFound("no KV reservation for '" + s.req.id + "' (expired or cancelled)");
    }
    const int need = kv_.BlocksFor(s.n_prompt);
    if (static_cast<int>(it->second.blocks.size()) < need) {
      return InvalidArgument("the reservation holds fewer blocks than the prompt needs");
    }
    s.blocks = std::move(it->second.blocks);
    reservations_.erase(it);
    s.n_computed = s.n_prompt;
    s.tokens.push_back(first_token);
    s.n_generated = 1;
    s.admitted_once = true;
    s.prompt_offered = false;
    s.first_scheduled = s.first_token = Clock::now();
    // The prefill side drew the first token with the same params: continue its stream.
    s.sampler->Resume(std::span(&first_token, 1));
    if (EndsGeneration(s.req, first_token, engine_->tokenizer().IsEndOfGeneration(first_token)) ||
        s.sampler->ConstraintFinished()) {
      SetFinish(s, FinishReason::kStop);
    } else if (s.n_generated >= s.req.max_tokens) {
      SetFinish(s, FinishReason::kLength);
    }
    auto owned = std::make_unique<Sequence>(std::move(s));
    waiting_.push_back(std::move(owned));
    ReapFinished();
    return true;
  });
  return st.ok() ? OkStatus() : st.status();
}

void LocalBackendImpl::CancelReservation(const std::string& id) {
  PostToLoop([this, id] {
    auto it = reservations_.find(id);
    if (it == reservations_.end()) return;
    kv_.Release(it->second.blocks);
    reservations_.erase(it);
  });
}

StatusOr<LocalBackend::Reserved> LocalBackendImpl::Reserve(const std::string& id,
                                                           std::vector<int32_t> prompt,
                                                           int n_tokens,
                                                           Clock::time_point expires) {
  if (id.empty()) return InvalidArgument("a reservation needs an id");
  if (n_tokens < 1) return InvalidArgument("a reservation needs at least one token");
  if (kv_.BlocksFor(n_tokens) > kv_.num_blocks()) {
    return OutOfRange(std::to_string(n_tokens) + " tokens exceed the KV cache (" +
                      std::to_string(int64_t{kv_.num_blocks()} * block_tokens_) + " tokens)");
  }
  return RunOnLoop<Reserved>([=, this, prompt = std::move(prompt)]() -> StatusOr<Reserved> {
    if (reservations_.count(id)) return InvalidArgument("'" + id + "' is already reserved");
    Reserved r;
    std::vector<uint64_t> keys;  // of the prompt's full blocks but the last token's
    if (options_.enable_prefix_cache && prompt.size() > 1) {
      const int max_blocks = static_cast<int>((prompt.size() - 1) / block_tokens_);
      keys = PrefixCache::BlockKeys(
          std::span(prompt).first(static_cast<size_t>(max_blocks) * block_tokens_), block_tokens_);
      r.blocks = prefix_cache_.Match(keys, max_blocks);
      r.cached_blocks = static_cast<int>(r.blocks.size());
    }
    const int need = kv_.BlocksFor(n_tokens) - r.cached_blocks;
    if (need > 0) {
      if (kv_.num_free() < need) prefix_cache_.Evict(need - kv_.num_free());
      auto got = kv_.Allocate(need);
      if (!got.ok()) {
        kv_.Release(r.blocks);
        return ResourceExhausted("the KV cache has no room for the reservation now (" +
                                 std::to_string(need) + " blocks wanted, " +
                                 std::to_string(kv_.num_free()) + " free)");
      }
      r.blocks.insert(r.blocks.end(), got->begin(), got->end());
    }
    // What the KV pool holds beyond the local prefix is read into the fresh blocks: the
    // prefill side then pushes only the rest (skip_blocks).
    if (UsesPool() && r.cached_blocks < static_cast<int>(keys.size())) {
      r.cached_blocks = ReadFromPool(keys, r.blocks, r.cached_blocks);
    }
    // Sliding layers: the writer fills only the window that the first decode step (at
    // position n_tokens - 1) reads; the cached prefix holds its part of it already.
    const int64_t window_from =
        std::max<int64_t>(int64_t{r.cached_blocks} * block_tokens_,
                          int64_t{kv_.WindowStartBlock(n_tokens - 1)} * block_tokens_);
    if (Status st = AttachWindow(r.blocks, window_from, n_tokens); !st.ok()) {
      kv_.Release(r.blocks);
      return ResourceExhausted("the KV window arena has no room for the reservation now (" +
                               st.message() + ")");
    }
    if (kv_.num_window_blocks() > 0) {
      for (int32_t b : r.blocks) r.window_blocks.push_back(kv_.window_block(b));
    }
    if (r.cached_blocks > 0) cache_hit_tokens_.fetch_add(int64_t{r.cached_blocks} * block_tokens_);
    reservations_[id] = Reservation{r.blocks, expires};
    return r;
  });
}

Status LocalBackendImpl::Validate(const GenerationRequest& request) const {
  const auto& cfg = engine_->config();
  TANDEM_RETURN_IF_ERROR(ValidateRequest(request, cfg.vocab_size, cfg.context_length));
  const int64_t n_prompt =
      static_cast<int64_t>(request.prompt_tokens.size() + request.resumed_output.size());
  if (kv_.BlocksFor(n_prompt + 1) > kv_.num_blocks()) {
    return OutOfRange("the prompt has " + std::to_string(n_prompt) +
                      " tokens; the KV cache holds " +
                      std::to_string(int64_t{kv_.num_blocks()} * block_tokens_) + " tokens");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Sequence>> LocalBackendImpl::NewSequence(
    GenerationRequest request, std::shared_ptr<GenerationSink> sink) const {
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::TokenConstraint> constraint,
      structured::MakeConstraint(request.sampling, [this] { return TokenTable(); }));
  auto seq = std::make_unique<Sequence>();
  seq->req = std::move(request);
  seq->sink = std::move(sink);
  seq->tokens = seq->req.prompt_tokens;
  seq->sampler = std::make_unique<engine::Sampler>(seq->req.sampling, seq->req.prompt_tokens,
                                                   end_tokens_, std::move(constraint));
  // A resumed stream: its output so far is computed with the prompt, and the sampler counts
  // it as drawn (GenerationRequest::resumed_output).
  const std::vector<int32_t>& resumed = seq->req.resumed_output;
  seq->tokens.insert(seq->tokens.end(), resumed.begin(), resumed.end());
  seq->sampler->Resume(resumed);
  seq->n_generated = static_cast<int>(resumed.size());
  seq->n_prompt = static_cast<int>(seq->tokens.size());
  return seq;
}

std::shared_ptr<const structured::TokenTable> LocalBackendImpl::TokenTable() const {
  std::call_once(token_table_once_, [this] {
    token_table_ = structured::TokenTable::FromTokenizer(engine_->tokenizer());
  });
  return token_table_;
}

Status LocalBackendImpl::CheckAcceptingLocked() const {
  if (draining_ || stop_) return FailedPrecondition("the server is shutting down");
  // waiting_count_ covers the inbox and the loop's queue; Admit refreshes it.
  if (waiting_count_.load() >= options_.max_waiting) {
    return ResourceExhausted("too many requests waiting (" + std::to_string(options_.max_waiting) +
                             ")");
  }
  return OkStatus();
}

void LocalBackendImpl::PostToLoop(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    commands_.push_back(std::move(fn));
    idle_ = false;
  }
  cv_.NotifyAll();
}

Status LocalBackendImpl::RunExclusive(std::function<Status(ExclusiveAccess&)> fn,
                                      int64_t prefill_tokens, Clock::time_point deadline) {
  // `taken` decides, once, between the loop running fn and the caller giving up on it.
  struct Call {
    std::atomic<bool> taken{false};
    std::promise<Status> done;
  };
  auto call = std::make_shared<Call>();
  auto done = call->done.get_future();
  {
    MutexLock lock(&mu_);
    if (stop_ || draining_) return FailedPrecondition("the server is shutting down");
  }
  PostToLoop([this, call, prefill_tokens, fn = std::move(fn)] {
    if (call->taken.exchange(true)) return;  // the caller gave up
    const Clock::time_point start = Clock::now();
    Access access(this);
    const Status st = fn(access);
    const int64_t us =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
    busy_us_prefill_.fetch_add(us);
    busy_core_us_prefill_.fetch_add(us * engine_->threads());
    computed_prefill_.fetch_add(prefill_tokens);
    call->done.set_value(st);
  });
  if (done.wait_until(deadline) != std::future_status::ready && !call->taken.exchange(true)) {
    return DeadlineExceeded("the engine loop did not get to the work before its deadline");
  }
  return done.get();  // started: it finishes whatever the deadline
}

Status LocalBackendImpl::SetEngineThreads(int threads) {
  auto set = RunOnLoop<int>([this, threads]() -> StatusOr<int> {
    TANDEM_RETURN_IF_ERROR(engine_->SetThreads(threads));
    engine_threads_.store(engine_->threads());
    return engine_->threads();
  });
  return set.status();
}

BackendStats LocalBackendImpl::Stats() const {
  BackendStats s;
  s.running = running_count_.load();
  s.waiting = waiting_count_.load();
  s.kv_blocks_total = kv_.num_blocks();
  s.kv_blocks_used = kv_used_.load();
  s.kv_blocks_cached = kv_cached_.load();
  s.kv_window_blocks_total = kv_.num_window_blocks();
  s.kv_window_blocks_used = kv_window_used_.load();
  s.prefix_cache_hit_tokens = cache_hit_tokens_.load();
  s.pool_hit_tokens = pool_hit_tokens_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generated_tokens = generated_tokens_.load();
  s.preemptions = preemptions_.load();
  s.preempt_offloaded_tokens = preempt_offloaded_.load();
  s.preempt_resumed_cache_tokens = preempt_resumed_cache_.load();
  s.preempt_resumed_pool_tokens = preempt_resumed_pool_.load();
  s.preempt_recomputed_tokens = preempt_recomputed_.load();
  s.pool_fetches_skipped = pool_fetches_skipped_.load();
  s.pool_window_misses = pool_window_misses_.load();
  s.reserved_blocks = reserved_blocks_.load();
  s.reservations_expired = reservations_expired_.load();
  s.busy_seconds_prefill = busy_us_prefill_.load() * 1e-6;
  s.busy_seconds_decode = busy_us_decode_.load() * 1e-6;
  s.busy_core_seconds_prefill = busy_core_us_prefill_.load() * 1e-6;
  s.busy_core_seconds_decode = busy_core_us_decode_.load() * 1e-6;
  s.sampling_seconds = sampling_ns_.load() * 1e-9;
  s.computed_tokens_prefill = computed_prefill_.load();
  s.computed_tokens_decode = computed_decode_.load();
  s.engine_threads = engine_threads_.load();
  s.engine_max_threads = engine_->max_threads();
  for (const engine::MemoryPart& p : memory_plan_.parts)
    s.memory_plan.emplace_back(p.name, p.bytes);
  s.memory_budget_bytes = options_.memory_budget_bytes;
  const ProcessMemory memory = ReadProcessMemory();
  s.resident_bytes = memory.resident_bytes;
  s.peak_resident_bytes = memory.peak_resident_bytes;
  return s;
}

void LocalBackendImpl::Drain(Clock::time_point deadline) {
  MutexLock lock(&mu_);
  draining_ = true;
  drain_deadline_ = deadline;
  cv_.NotifyAll();
  idle_cv_.Wait(&mu_, [&] {
    mu_.AssertHeld();
    return idle_;
  });
}

Clock::time_point LocalBackendImpl::NextReservationExpiry() const {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [id, r] : reservations_) next = std::min(next, r.expires);
  return next;
}

}  // namespace internal

std::unique_ptr<LocalBackend> MakeLocalBackend(engine::Engine* engine,
                                               const SchedulerOptions& options) {
  return std::make_unique<internal::LocalBackendImpl>(engine, options);
}

}  // namespace tandem::serving
