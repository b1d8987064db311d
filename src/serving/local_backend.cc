#include "serving/local_backend.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/process_memory.h"
#include "engine/memory_plan.h"
#include "serving/prefix_cache.h"
#include "structured/token_constraint.h"

namespace tandem::serving {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One request inside the loop. Owned by the loop thread once taken from the inbox.
struct Sequence {
  GenerationRequest req;
  std::shared_ptr<GenerationSink> sink;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int n_prompt = 0;
  int n_computed = 0;           // leading tokens whose KV is in `blocks`
  std::vector<int32_t> blocks;  // KV blocks in position order (references owned)
  std::vector<uint64_t> keys;   // prefix-cache keys of the first keys.size() full blocks of
                                // tokens; tokens only grow, so keys are extended, never redone
  std::unique_ptr<engine::Sampler> sampler;
  std::shared_ptr<KvObserver> observer;  // prefill side of disaggregation; may be null
  int n_generated = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  bool admitted_once = false;
  bool prompt_offered = false;  // prompt blocks given to the prefix cache
  int pool_known = 0;           // leading blocks known to be in the KV pool (read from it)
  int preempted_tokens = 0;     // tokens it had computed when last preempted, until resumed
  std::vector<engine::SampledToken> prompt_lp;  // prompt logprobs gathered so far
  bool prompt_lp_sent = false;                  // the sink has them
  Clock::time_point first_scheduled{};
  Clock::time_point first_token{};
  std::optional<FinishReason> finish;
  std::string finish_message;

  int pending() const { return static_cast<int>(tokens.size()) - n_computed; }
};

// Blocks held for KV that a prefill worker is writing in (decode side).
struct Reservation {
  std::vector<int32_t> blocks;
  Clock::time_point expires;
};

class LocalBackendImpl final : public LocalBackend {
 public:
  LocalBackendImpl(engine::Engine* engine, const SchedulerOptions& options)
      : LocalBackend(engine),
        options_(options),
        kv_(engine->kv()),
        block_tokens_(kv_.shape().block_tokens),
        prefix_cache_(&kv_),
        end_tokens_(engine->tokenizer().EndOfGenerationIds()),
        log_(GetLogger("scheduler")) {
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

  ~LocalBackendImpl() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    loop_.join();
  }

  Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) override
      TANDEM_EXCLUDES(mu_) {
    return SubmitObserved(std::move(request), std::move(sink), nullptr);
  }

  Status SubmitObserved(GenerationRequest request, std::shared_ptr<GenerationSink> sink,
                        std::shared_ptr<KvObserver> observer) override TANDEM_EXCLUDES(mu_) {
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

  StatusOr<Reserved> ReserveBlocks(const std::string& id, int n_tokens,
                                   Clock::time_point expires) override {
    return Reserve(id, {}, n_tokens, expires);
  }

  StatusOr<Reserved> ReservePrompt(const std::string& id, std::span<const int32_t> prompt,
                                   int n_tokens, Clock::time_point expires) override {
    return Reserve(id, std::vector<int32_t>(prompt.begin(), prompt.end()), n_tokens, expires);
  }

  std::vector<uint64_t> CachedBlockKeys() const override TANDEM_EXCLUDES(keys_mu_) {
    MutexLock lock(&keys_mu_);
    return cached_keys_;
  }

  Status SubmitPrefilled(GenerationRequest request, int32_t first_token,
                         std::shared_ptr<GenerationSink> sink) override {
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

  void CancelReservation(const std::string& id) override {
    PostToLoop([this, id] {
      auto it = reservations_.find(id);
      if (it == reservations_.end()) return;
      kv_.Release(it->second.blocks);
      reservations_.erase(it);
    });
  }

 private:
  // Reserves n_tokens positions under `id`, the first full blocks of `prompt` (if any) from
  // the prefix cache.
  StatusOr<Reserved> Reserve(const std::string& id, std::vector<int32_t> prompt, int n_tokens,
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
            std::span(prompt).first(static_cast<size_t>(max_blocks) * block_tokens_),
            block_tokens_);
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
        const int from = r.cached_blocks;
        const auto wanted = std::span(keys).subspan(from);
        const int filled =
            options_.kv_pool->Fetch(wanted, std::span(r.blocks).subspan(from, wanted.size()));
        for (int i = 0; i < filled; ++i) prefix_cache_.Insert(wanted[i], r.blocks[from + i]);
        r.cached_blocks += filled;
        pool_hit_tokens_.fetch_add(int64_t{filled} * block_tokens_);
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
      if (r.cached_blocks > 0)
        cache_hit_tokens_.fetch_add(int64_t{r.cached_blocks} * block_tokens_);
      reservations_[id] = Reservation{r.blocks, expires};
      return r;
    });
  }

  Status Validate(const GenerationRequest& request) const {
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

  // InvalidArgument when the request's structured-output schema does not compile.
  StatusOr<std::unique_ptr<Sequence>> NewSequence(GenerationRequest request,
                                                  std::shared_ptr<GenerationSink> sink) const {
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

  // Every token's bytes, for structured output (built at the first such request).
  std::shared_ptr<const structured::TokenTable> TokenTable() const {
    std::call_once(token_table_once_, [this] {
      token_table_ = structured::TokenTable::FromTokenizer(engine_->tokenizer());
    });
    return token_table_;
  }

  Status CheckAcceptingLocked() const TANDEM_REQUIRES(mu_) {
    if (draining_ || stop_) return FailedPrecondition("the server is shutting down");
    // waiting_count_ covers the inbox and the loop's queue; Admit refreshes it.
    if (waiting_count_.load() >= options_.max_waiting) {
      return ResourceExhausted("too many requests waiting (" +
                               std::to_string(options_.max_waiting) + ")");
    }
    return OkStatus();
  }

  // Queues fn for the loop thread (between steps).
  void PostToLoop(std::function<void()> fn) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      commands_.push_back(std::move(fn));
      idle_ = false;
    }
    cv_.NotifyAll();
  }

  // Runs fn on the loop thread and returns its result; Unavailable if the loop does not get to
  // it within kCommandWait (a step is at most a few seconds) or is stopping.
  template <typename T>
  StatusOr<T> RunOnLoop(std::function<StatusOr<T>()> fn) TANDEM_EXCLUDES(mu_) {
    constexpr auto kCommandWait = std::chrono::seconds(30);
    auto promise = std::make_shared<std::promise<StatusOr<T>>>();
    auto future = promise->get_future();
    {
      MutexLock lock(&mu_);
      if (stop_ || draining_) return FailedPrecondition("the server is shutting down");
    }
    PostToLoop([promise, fn = std::move(fn)] { promise->set_value(fn()); });
    if (future.wait_for(kCommandWait) != std::future_status::ready) {
      return Unavailable("the engine loop did not answer in time");
    }
    return future.get();
  }

  Status RunExclusive(std::function<Status(ExclusiveAccess&)> fn, int64_t prefill_tokens,
                      Clock::time_point deadline) override TANDEM_EXCLUDES(mu_) {
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
      busy_us_prefill_.fetch_add(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
      computed_prefill_.fetch_add(prefill_tokens);
      call->done.set_value(st);
    });
    if (done.wait_until(deadline) != std::future_status::ready && !call->taken.exchange(true)) {
      return DeadlineExceeded("the engine loop did not get to the work before its deadline");
    }
    return done.get();  // started: it finishes whatever the deadline
  }

  // RunExclusive's view of the loop (loop thread only).
  class Access final : public ExclusiveAccess {
   public:
    explicit Access(LocalBackendImpl* b) : b_(b) {}
    engine::Engine& engine() override { return *b_->engine_; }
    StatusOr<std::vector<int32_t>> AllocateBlocks(int n) override {
      if (b_->kv_.num_free() < n) b_->prefix_cache_.Evict(n - b_->kv_.num_free());
      auto got = b_->kv_.Allocate(n);
      if (!got.ok()) {
        return ResourceExhausted("no room for " + std::to_string(n) + " KV blocks (" +
                                 std::to_string(b_->kv_.num_free()) + " free, the rest in use)");
      }
      return got;
    }
    Status AttachWindow(std::span<const int32_t> table, int64_t first_pos,
                        int64_t end_pos) override {
      return b_->AttachWindow(table, first_pos, end_pos);
    }

   private:
    LocalBackendImpl* b_;
  };

  BackendStats Stats() const override {
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
    s.reserved_blocks = reserved_blocks_.load();
    s.reservations_expired = reservations_expired_.load();
    s.busy_seconds_prefill = busy_us_prefill_.load() * 1e-6;
    s.busy_seconds_decode = busy_us_decode_.load() * 1e-6;
    s.sampling_seconds = sampling_ns_.load() * 1e-9;
    s.computed_tokens_prefill = computed_prefill_.load();
    s.computed_tokens_decode = computed_decode_.load();
    s.engine_threads = engine_->options().threads;
    for (const engine::MemoryPart& p : memory_plan_.parts)
      s.memory_plan.emplace_back(p.name, p.bytes);
    s.memory_budget_bytes = options_.memory_budget_bytes;
    const ProcessMemory memory = ReadProcessMemory();
    s.resident_bytes = memory.resident_bytes;
    s.peak_resident_bytes = memory.peak_resident_bytes;
    return s;
  }

  void Drain(Clock::time_point deadline) override TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    draining_ = true;
    drain_deadline_ = deadline;
    cv_.NotifyAll();
    idle_cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return idle_;
    });
  }

 private:
  Clock::time_point NextReservationExpiry() const {
    Clock::time_point next = Clock::time_point::max();
    for (const auto& [id, r] : reservations_) next = std::min(next, r.expires);
    return next;
  }
  bool ReservationDue() const { return Clock::now() >= NextReservationExpiry(); }

  void Loop() TANDEM_EXCLUDES(mu_) {
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

  void CancelAll(const std::string& why) TANDEM_EXCLUDES(mu_) {
    for (auto& [id, r] : reservations_) kv_.Release(r.blocks);
    reservations_.clear();
    for (auto& s : running_) SetFinish(*s, FinishReason::kCancelled, why);
    for (auto& s : waiting_) SetFinish(*s, FinishReason::kCancelled, why);
    ReapFinished();
    PublishStats();
  }

  void SetFinish(Sequence& s, FinishReason r, std::string message = {}) {
    if (!s.finish) {
      s.finish = r;
      s.finish_message = std::move(message);
    }
  }

  void ExpireDeadlines() {
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

  // Ensures `s` holds blocks for `n_tokens` positions, evicting cached blocks if needed.
  bool Reserve(Sequence& s, int64_t n_tokens) {
    const int need = kv_.BlocksFor(n_tokens) - static_cast<int>(s.blocks.size());
    if (need <= 0) return true;
    if (kv_.num_free() < need) prefix_cache_.Evict(need - kv_.num_free());
    auto got = kv_.Allocate(need);
    if (!got.ok()) return false;
    s.blocks.insert(s.blocks.end(), got->begin(), got->end());
    return true;
  }

  // Ensures `s` can compute its next n positions: blocks for them, and (sliding layers) window
  // storage for the blocks they are written to.
  bool ReserveStep(Sequence& s, int n) {
    return Reserve(s, s.n_computed + n) &&
           AttachWindow(s.blocks, s.n_computed, s.n_computed + n).ok();
  }

  // kv_.AttachWindow; when too little is free, first takes window storage back from blocks
  // only the prefix cache holds, then unpins the cache's windows and lets every running
  // sequence give back what it has moved past, before the caller preempts anyone.
  Status AttachWindow(std::span<const int32_t> table, int64_t first_pos, int64_t end_pos) {
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

  // Gives back the window storage of the blocks `s` has moved past. The prefix cache's
  // references keep a window only where it is pinned.
  void TrimWindow(Sequence& s) {
    kv_.TrimWindow(s.blocks, s.n_computed, [this](int32_t b) {
      return prefix_cache_.Holds(b) && !prefix_cache_.PinsWindow(b) ? 1 : 0;
    });
  }

  void Admit() {
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
      if (!Reserve(s, static_cast<int64_t>(s.tokens.size()))) {
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

  // Counts how a preempted sequence's computed tokens came back on its admission: the first
  // `from_cache` of its n_computed from the prefix cache, the rest of n_computed from the pool.
  void CountResumed(Sequence& s, int from_cache) {
    const int cache = std::min(from_cache, s.preempted_tokens);
    const int pool = std::min(s.n_computed, s.preempted_tokens) - cache;
    preempt_resumed_cache_.fetch_add(cache);
    preempt_resumed_pool_.fetch_add(pool);
    preempt_recomputed_.fetch_add(s.preempted_tokens - cache - pool);
    s.preempted_tokens = 0;
  }

  // Admits the waiting sequences after the head that already hold blocks (KV pushed by a
  // prefill worker) and can get the rest now, in order.
  void AdmitHoldersBehind() {
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

  bool UsesPool() const {
    return options_.kv_pool != nullptr && options_.enable_prefix_cache &&
           kv_.num_window_blocks() == 0;
  }

  // Whether reading a block from the KV pool costs less than computing it, as measured here:
  // the pool's wall time per block it gave (misses included) against the engine's prefill time
  // per block of tokens. Until kMinFetchedBlocks blocks came from the pool it fetches (nothing
  // measured yet); after deciding against it kFetchProbeEvery times in a row it fetches once
  // more, so that a pool that became faster is seen. Skips are counted.
  bool FetchPaysOff() {
    const int64_t computed = computed_prefill_.load();
    if (fetched_blocks_ < kMinFetchedBlocks || computed == 0) return true;
    const double fetch_s = static_cast<double>(fetch_ns_) * 1e-9 / fetched_blocks_;
    const double compute_s =
        static_cast<double>(busy_us_prefill_.load()) * 1e-6 / computed * block_tokens_;
    if (fetch_s < compute_s || ++skipped_in_a_row_ >= kFetchProbeEvery) {
      skipped_in_a_row_ = 0;
      return true;
    }
    pool_fetches_skipped_.fetch_add(1);
    return false;
  }

  // For a sequence whose blocks hold its local prefix-cache hit (n_computed tokens) followed by
  // fresh blocks for the rest: reads what the KV pool holds of the following full blocks into
  // those fresh blocks, which the prefix cache then holds too.
  void FetchFromPool(Sequence& s) {
    const int have = s.n_computed / block_tokens_;
    const int max_blocks = static_cast<int>((s.tokens.size() - 1) / block_tokens_);
    if (have >= max_blocks) return;
    const auto keys = KeysOf(s, s.tokens.size()).subspan(have, max_blocks - have);
    const Clock::time_point start = Clock::now();
    const int filled =
        options_.kv_pool->Fetch(keys, std::span(s.blocks).subspan(have, max_blocks - have));
    fetch_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    fetched_blocks_ += filled;
    for (int i = 0; i < filled; ++i) prefix_cache_.Insert(keys[i], s.blocks[have + i]);
    if (filled > 0) {
      s.n_computed += filled * block_tokens_;
      s.pool_known = have + filled;
      pool_hit_tokens_.fetch_add(int64_t{filled} * block_tokens_);
    }
  }

  // Offers the full blocks of a finished sequence that the pool may lack.
  void OfferToPool(Sequence& s) {
    if (!UsesPool()) return;
    const auto keys = KeysOf(s, s.n_computed);
    const size_t n = std::min(keys.size(), s.blocks.size());
    const size_t from = std::min(n, static_cast<size_t>(s.pool_known));
    if (from == n) return;
    options_.kv_pool->Offer(keys.subspan(from, n - from),
                            std::span(s.blocks).subspan(from, n - from));
    s.pool_known = static_cast<int>(n);
  }

  // Frees the newest running sequence other than `keep` for recompute later; false if none.
  bool PreemptOne(const Sequence* keep) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Sequence& s = **it;
      if (&s == keep || s.finish) continue;
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
      waiting_.push_front(std::move(*it));
      running_.erase(std::next(it).base());
      preemptions_.fetch_add(1);
      log_->info("preempted {} at {} tokens (KV cache full){}", waiting_.front()->req.id,
                 waiting_.front()->preempted_tokens, UsesPool() ? "; its KV went to the pool" : "");
      return true;
    }
    return false;
  }

  // Offers a sequence's computed full blocks to the prefix cache, pinning the window behind
  // their end (sliding-window models) so that the prefix can be resumed from there.
  void OfferBlocks(Sequence& s) {
    if (!options_.enable_prefix_cache) return;
    const auto keys = KeysOf(s, s.n_computed);
    const size_t n = std::min(keys.size(), s.blocks.size());
    for (size_t i = 0; i < n; ++i) prefix_cache_.Insert(keys[i], s.blocks[i]);
    for (size_t i = kv_.WindowStartBlock(static_cast<int64_t>(n) * block_tokens_); i < n; ++i) {
      if (kv_.HasWindow(s.blocks[i])) prefix_cache_.PinWindow(s.blocks[i]);
    }
  }

  // Keys of the full blocks among the first n_tokens tokens of `s`, hashing only blocks not
  // hashed before.
  std::span<const uint64_t> KeysOf(Sequence& s, size_t n_tokens) {
    const size_t want = n_tokens / block_tokens_;
    if (s.keys.size() < want) {
      const size_t done = s.keys.size();
      const uint64_t seed = done == 0 ? 0 : s.keys.back();
      const auto more = PrefixCache::BlockKeys(
          std::span(s.tokens).subspan(done * block_tokens_, (want - done) * block_tokens_),
          block_tokens_, seed);
      s.keys.insert(s.keys.end(), more.begin(), more.end());
    }
    return std::span(s.keys).first(want);
  }

  void Step() {
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
    engine_->pool().ParallelFor(static_cast<int64_t>(drawing.size()), [&](int64_t begin,
                                                                          int64_t end, int) {
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

  static bool WantsPromptLogprobs(const Sequence& s) {
    return s.req.sampling.prompt_logprobs >= 0 && !s.prompt_lp_sent;
  }

  // Prompt logprobs: row j of an all_logits item (position start + j) scores the prompt token
  // at start + j + 1.
  void CollectPromptLogprobs(Sequence& s, const engine::BatchItem& item, const float* rows) {
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

  // Adds a forward step's time to the busy counters, split by its tokens: a decode token is one
  // generated token fed back (one position past the prompt); anything else is prefill work.
  template <typename PlannedList>
  void CountBusy(const PlannedList& plan, Clock::duration took) {
    int64_t prefill = 0, decode = 0;
    for (const auto& p : plan) {
      if (p.n == 1 && p.seq->n_computed >= p.seq->n_prompt) {
        ++decode;
      } else {
        prefill += p.n;
      }
    }
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
    const int64_t prefill_us = prefill + decode > 0 ? us * prefill / (prefill + decode) : 0;
    busy_us_prefill_.fetch_add(prefill_us);
    busy_us_decode_.fetch_add(us - prefill_us);
    computed_prefill_.fetch_add(prefill);
    computed_decode_.fetch_add(decode);
  }

  // Finishes every sequence marked finished: frees its blocks and tells its sink.
  void ReapFinished() {
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

  void PublishStats() TANDEM_EXCLUDES(mu_, keys_mu_) {
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

  SchedulerOptions options_;
  engine::MemoryPlan memory_plan_;  // set at construction
  engine::PagedKvCache& kv_;
  const int block_tokens_;
  PrefixCache prefix_cache_;               // loop thread only
  const std::vector<int32_t> end_tokens_;  // the model's end-of-generation ids (min_tokens)
  mutable std::once_flag token_table_once_;
  mutable std::shared_ptr<const structured::TokenTable> token_table_;  // set once, then read-only
  std::shared_ptr<spdlog::logger> log_;
  std::vector<float> logits_;  // loop thread only

  // Loop thread only (no lock; RunOnLoop / PostToLoop run other threads' work there).
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  // Nothing runs and the waiting could not be admitted at the last turn (loop thread only; read
  // by the loop's own wait).
  bool admission_stalled_ = false;
  static constexpr std::chrono::milliseconds kStalledRetry{20};
  // The KV pool's measured cost (FetchPaysOff): wall nanoseconds of its fetches, the blocks
  // they gave, and decisions against it since the last fetch.
  int64_t fetch_ns_ = 0;
  int64_t fetched_blocks_ = 0;
  int skipped_in_a_row_ = 0;
  static constexpr int64_t kMinFetchedBlocks = 8;
  static constexpr int kFetchProbeEvery = 16;

  Mutex mu_;
  CondVar cv_;       // work arrived or stop/drain requested
  CondVar idle_cv_;  // the loop went idle
  std::vector<std::unique_ptr<Sequence>> inbox_ TANDEM_GUARDED_BY(mu_);
  std::vector<std::function<void()>> commands_ TANDEM_GUARDED_BY(mu_);  // run by the loop thread
  std::unordered_map<std::string, Reservation> reservations_;           // loop thread only
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  bool draining_ TANDEM_GUARDED_BY(mu_) = false;
  bool idle_ TANDEM_GUARDED_BY(mu_) = true;
  Clock::time_point drain_deadline_ TANDEM_GUARDED_BY(mu_) = Clock::time_point::max();

  // Published by the loop thread for Stats() and CheckAcceptingLocked(): lock-free.
  std::atomic<int> running_count_{0};
  std::atomic<int> waiting_count_{0};
  std::atomic<int> kv_used_{0};
  std::atomic<int> kv_cached_{0};
  std::atomic<int> kv_window_used_{0};
  std::atomic<int64_t> cache_hit_tokens_{0};
  std::atomic<int64_t> pool_hit_tokens_{0};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generated_tokens_{0};
  std::atomic<int64_t> preemptions_{0};
  std::atomic<int64_t> preempt_offloaded_{0}, preempt_resumed_cache_{0}, preempt_resumed_pool_{0},
      preempt_recomputed_{0};
  std::atomic<int64_t> pool_fetches_skipped_{0};  // FetchPaysOff said no
  std::atomic<int> reserved_blocks_{0};
  std::atomic<int64_t> reservations_expired_{0};
  std::atomic<int64_t> busy_us_prefill_{0};  // microseconds of forward passes (CountBusy)
  std::atomic<int64_t> busy_us_decode_{0};
  std::atomic<int64_t> sampling_ns_{0};
  std::atomic<int64_t> computed_prefill_{0};
  std::atomic<int64_t> computed_decode_{0};

  mutable Mutex keys_mu_;
  std::vector<uint64_t> cached_keys_ TANDEM_GUARDED_BY(keys_mu_);  // the prefix cache's keys
  uint64_t published_keys_version_ = 0;  // loop thread only: the version cached_keys_ holds

  std::thread loop_;  // last: starts after every member above is constructed
};

}  // namespace

std::unique_ptr<LocalBackend> MakeLocalBackend(engine::Engine* engine,
                                               const SchedulerOptions& options) {
  return std::make_unique<LocalBackendImpl>(engine, options);
}

}  // namespace tandem::serving
