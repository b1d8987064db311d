// ConductorImpl: one request from its thread's start to OnFinish.
#include "conductor/conductor_impl_internal.h"

namespace tandem::conductor::internal {

bool ConductorImpl::Prefill(RequestRun* run, const KvTarget& target) {
  if (PrefillPipelined(run, target)) return true;
  std::vector<std::string> tried;
  while (!run->prefill.empty()) {
    tried.push_back(run->prefill);
    const auto client = ClientOf(run->prefill);
    Status st;
    if (client) {
      bool connection_failed = false;
      auto result =
          client->Prefill(PrefillCallFor(*run, target), run->r.deadline, &connection_failed);
      if (result.ok()) {
        run->prefill_result = *result;
        MutexLock lock(&mu_);
        view_.PrefillDone(run->load, run->prefill, run->decode, result->transfer_seconds,
                          Clock::now());
        return true;
      }
      st = result.status().WithContext("prefill worker " + run->prefill);
      if (connection_failed) Suspect(run->prefill);
    } else {
      st = NotFound("prefill worker " + run->prefill + " is gone");
    }
    log_->warn("{}: prefill on {} failed: {}", run->r.id, run->prefill, st.ToString());
    if (Clock::now() >= run->r.deadline) {
      run->error = DeadlineExceeded(serving::kRequestDeadlinePassed);
      return false;
    }
    // Another prefill worker, not tried yet; the decode side and its reservation stay.
    MutexLock lock(&mu_);
    view_.Release(run->load.seq, "", run->prefill);
    std::string decode_unused, next;
    const Placement p = PlaceLocked(*run, AdmissionPolicy::kNone, tried, &decode_unused, &next);
    if (p.outcome != Placement::Outcome::kPlaced) next.clear();
    run->prefill = next;
    if (!next.empty()) {
      view_.ReassignPrefill(run->load.seq, next, p.predicted_prefill_s, Clock::now());
      metrics_.prefill_retries.fetch_add(1);
    }
  }
  return false;
}

std::vector<StageWorker> ConductorImpl::PipelineGroup(const RequestRun& run,
                                                      const KvTarget& target) {
  const int uncached =
      static_cast<int>(run.r.prompt_tokens.size()) - target.skip_blocks * target.block_tokens;
  if (run.prefill.empty() || !WantsPipeline(options_.pipeline, run.r.sampling, uncached)) {
    return {};
  }
  MutexLock lock(&mu_);
  return ChoosePipelineGroup(view_, run.prefill, options_.pipeline.max_stages, Clock::now());
}

bool ConductorImpl::PrefillPipelined(RequestRun* run, const KvTarget& target) {
  const std::vector<StageWorker> group = PipelineGroup(*run, target);
  if (group.size() < 2) return false;
  const PrefillCall call = PrefillCallFor(*run, target);
  const std::string session =
      run->r.id + "/pipeline-" + std::to_string(pipeline_attempts_.fetch_add(1) + 1);
  const PipelinePlan plan =
      PlanPipeline(group[0].info, static_cast<int64_t>(call.prompt_tokens.size()),
                   static_cast<int>(group.size()), options_.pipeline);
  // Every stage is busy with the pipeline while it runs: placement sees it in their queues.
  std::vector<std::string> stages;
  for (const StageWorker& w : group) stages.push_back(w.info.name);
  {
    MutexLock lock(&mu_);
    view_.PipelineStarted(run->load.seq, stages, plan.split.pipelined_seconds, Clock::now());
  }
  auto done = RunPipelinedPrefill(call, group, plan, session, run->r.deadline);
  {
    MutexLock lock(&mu_);
    view_.PipelineEnded(run->load.seq, stages, done.ok(), Clock::now());
  }
  if (!done.ok()) {
    metrics_.pipelined_failures.fetch_add(1);
    log_->warn("{}: pipelined prefill failed ({}); prefilling on {} alone", run->r.id,
               done.status().ToString(), run->prefill);
    return false;
  }
  metrics_.pipelined_prefills.fetch_add(1);
  metrics_.pipeline_stage_bytes.fetch_add(static_cast<int64_t>(done->stage_bytes));
  std::string layout;
  for (size_t i = 0; i < group.size(); ++i) {
    layout += fmt::format("{}{} layers {}..{}", i ? ", " : "", group[i].info.name,
                          done->split.bounds[i], done->split.bounds[i + 1]);
  }
  log_->info(
      "{}: {} prompt tokens prefilled by a pipeline ({}) in chunks of {}: {:.2f} s (predicted "
      "{:.2f} s; one worker {:.2f} s), {:.1f} MiB between stages, a stage waited {:.2f} s for "
      "input at most",
      run->r.id, call.prompt_tokens.size(), layout, done->chunk_tokens,
      done->result.prefill_seconds, done->split.pipelined_seconds, done->split.single_seconds,
      done->stage_bytes / 1048576.0, done->most_wait_seconds);
  run->prefill_result = done->result;
  run->pipelined = true;
  MutexLock lock(&mu_);
  view_.PrefillDone(run->load, run->prefill, run->decode, done->result.transfer_seconds,
                    Clock::now());
  return true;
}

void ConductorImpl::Run(std::unique_ptr<RequestRun> run) {
  bool local_fallback = false;
  bool first = true;
  bool resume = false;  // the decode worker failed: continue on another one
  while (true) {
    if (!PlaceForRun(run.get(), first, local_fallback, resume)) {
      if (resume) metrics_.failed_migrations.fetch_add(1);
      break;
    }
    first = false;
    if (!WaitForPrefillTurn(run.get(), /*may_replace=*/!local_fallback && !resume)) {
      if (resume) metrics_.failed_migrations.fetch_add(1);
      MutexLock lock(&mu_);
      view_.Release(run->load.seq, run->decode, run->prefill);
      break;
    }
    if (resume) metrics_.migrations.fetch_add(1);
    const bool local = run->prefill.empty();
    if (local_fallback && !resume) metrics_.fallbacks.fetch_add(1);
    run->fall_back_local = run->retry_kv = false;
    resume = false;
    run->predicted_ttft_s = run->placement.predicted_ttft_s;
    run->predicted_tbt_s = run->placement.predicted_tbt_s;
    RunOnDecode(run.get(), local);
    {
      MutexLock lock(&mu_);
      view_.Release(run->load.seq, run->decode, run->prefill);
    }
    cv_.NotifyAll();
    if (run->cancelled || run->finish) break;
    if (!run->fall_back_local && !run->retry_kv && MayMigrate(*run)) {
      // The decode worker failed (mid-stream, or before its first token): another one (or
      // the restarted one) computes the prompt and the output so far, and continues the
      // same stream.
      log_->warn("{}: {} failed after {} tokens ({}); continuing the stream elsewhere", run->r.id,
                 run->decode, run->tokens, run->error.message());
      run->error = Status();
      ++run->migrations;
      resume = true;
      continue;
    }
    if (run->tokens > 0) break;
    if (run->retry_kv) {
      run->error = Status();
      continue;  // the decode worker had no room after all: wait for room, place again
    }
    if (!run->fall_back_local || local_fallback) break;
    local_fallback = true;  // no prefill worker could do it: the decode worker computes it
    log_->warn("{}: no prefill worker succeeded; computing the prompt on {}", run->r.id,
               run->decode);
  }
  Finish(run.get(), local_fallback);
  {
    MutexLock lock(&mu_);
    --active_;
    finished_threads_.push_back(run->load.seq);
  }
  cv_.NotifyAll();
}

bool ConductorImpl::MayMigrate(const RequestRun& run) const {
  constexpr int kMaxMigrations = 3;
  const StatusCode code = run.error.code();
  const bool worker_failed = code == StatusCode::kUnavailable || code == StatusCode::kInternal ||
                             code == StatusCode::kDataLoss;
  return worker_failed && !run.finish && !run.cancelled && !cancel_all_.load() &&
         run.migrations < kMaxMigrations && run.tokens < run.r.max_tokens &&
         run.r.sampling.prompt_logprobs < 0 && Clock::now() < run.r.deadline;
}

void ConductorImpl::Finish(RequestRun* run, bool fell_back) {
  const bool local = run->prefill.empty() && run->migrations == 0;
  if (!run->prefill.empty() && run->finish) metrics_.disaggregated.fetch_add(1);
  if (local && !fell_back && run->finish) metrics_.local_prefills.fetch_add(1);
  serving::FinishInfo info;
  const auto now = Clock::now();
  if (run->finish) {
    info = *run->finish;
  } else if (run->cancelled || cancel_all_.load()) {
    info.reason = serving::FinishReason::kCancelled;
    info.message = run->cancelled ? "cancelled by the client" : "the server stopped";
  } else {
    const Status e = run->error.ok()
                         ? Unavailable("decode worker " + run->decode + " ended the stream early")
                         : run->error;
    info.reason = e.code() == StatusCode::kDeadlineExceeded ? serving::FinishReason::kTimeout
                                                            : serving::FinishReason::kError;
    info.message = e.message();
    if (info.reason == serving::FinishReason::kError) metrics_.worker_failures.fetch_add(1);
  }
  info.prompt_tokens = run->load.prompt_tokens;
  info.completion_tokens = std::max(info.completion_tokens, run->tokens);
  info.total_seconds = Seconds(now - run->r.arrival);
  info.ttft_seconds = run->tokens > 0 ? Seconds(run->first_token_at - run->r.arrival) : 0;
  int computed_prompt = 0;
  if (run->prefill_result && !local) {
    info.cached_prompt_tokens = run->prefill_result->cached_tokens;
    info.queue_seconds =
        run->prefill_result->queue_seconds + Seconds(run->committed_at - run->r.arrival);
    info.prefill_seconds = run->prefill_result->prefill_seconds;
    info.kv_transfer_seconds = run->prefill_result->transfer_seconds;
    computed_prompt = run->load.prompt_tokens - run->prefill_result->cached_tokens;
  } else {
    // Not disaggregated: no hand-off to break the TTFT into.
    info.prefill_seconds = info.kv_transfer_seconds = info.first_decode_seconds = -1;
    if (!run->finish) info.queue_seconds = info.total_seconds;
    if (run->tokens > 0) computed_prompt = run->load.prompt_tokens - info.cached_prompt_tokens;
  }
  // Prediction quality and SLOs, for requests that produced tokens.
  if (run->tokens > 0) {
    const double ttft_from_placement = Seconds(run->first_token_at - run->committed_at);
    const double tbt =
        run->tokens > 1 ? Seconds(now - run->first_token_at) / (run->tokens - 1) : -1;
    metrics_.ObservePrediction(run->predicted_ttft_s, ttft_from_placement, run->predicted_tbt_s,
                               tbt);
    const bool met = (run->slo_ttft_s <= 0 || info.ttft_seconds <= run->slo_ttft_s) &&
                     (run->slo_tbt_s <= 0 || tbt < 0 || tbt <= run->slo_tbt_s);
    const bool completed = run->finish && (run->finish->reason == serving::FinishReason::kStop ||
                                           run->finish->reason == serving::FinishReason::kLength);
    if (run->slo_ttft_s > 0 || run->slo_tbt_s > 0) metrics_.CountSlo(completed && met);
    metrics_.PrefillTokens(!completed ? "failed" : (met ? "slo_met" : "slo_missed"),
                           std::max(0, computed_prompt));
    MutexLock lock(&mu_);
    expected_output_ = 0.9 * expected_output_ + 0.1 * info.completion_tokens;
    if (tbt > 0) view_.DecodeMeasured(run->decode, run->predicted_tbt_s, tbt);
    if (run->prefill_result && !local && !run->pipelined) {
      const int cached = run->prefill_result->cached_tokens;
      view_.PrefillMeasured(run->prefill, run->load.prompt_tokens - cached, cached,
                            run->prefill_result->prefill_seconds);
    }
  }
  run->sink->OnFinish(info);
}

void ConductorImpl::RunOnDecode(RequestRun* run, bool local) {
  const auto client = ClientOf(run->decode);
  if (!client) {
    run->error = Unavailable("decode worker " + run->decode + " is gone");
    return;
  }
  DecodeCall call;
  call.id = run->r.id;
  call.prompt_tokens = run->r.prompt_tokens;
  call.max_tokens = run->r.max_tokens;
  call.ignore_eos = run->r.ignore_eos;
  call.sampling = run->r.sampling;
  call.timeout_ms = MillisUntil(run->r.deadline);
  // The reservation lives as long as the request may: the conductor cancels it explicitly
  // when the prefill fails, and the worker frees it at the deadline if the conductor is gone.
  call.kv_wait_ms = call.timeout_ms;
  call.local = local;
  call.resumed_output = run->output;  // empty unless the stream resumes after a failure
  auto emit = [&](const engine::SampledToken& token) {
    if (run->tokens == 0) run->first_token_at = Clock::now();
    ++run->tokens;
    run->output.push_back(token.token);
    {
      MutexLock lock(&mu_);
      view_.TokenEmitted(run->load.seq, run->decode);
    }
    if (cancel_all_.load() || !run->sink->OnToken(token)) {
      run->cancelled = !cancel_all_.load();
      return false;
    }
    return true;
  };
  auto on_event = [&](const DecodeEvent& e) -> bool {
    switch (e.kind) {
      case DecodeEvent::Kind::kReserved: {
        {
          MutexLock lock(&mu_);
          view_.ReservationMade(run->load.seq, run->decode, Clock::now());
        }
        if (!Prefill(run, e.reserved)) {
          // Free the reservation, then (unless the deadline passed) redo it locally.
          client->Cancel(run->r.id, Clock::now() + std::chrono::seconds(2));
          run->fall_back_local = run->error.ok();
          return false;
        }
        return emit(run->prefill_result->first_token);
      }
      case DecodeEvent::Kind::kToken:
        if (local && run->tokens == 0) {
          MutexLock lock(&mu_);
          view_.PrefillDone(run->load, "", run->decode, -1, Clock::now());
        }
        return emit(e.token);
      case DecodeEvent::Kind::kPromptLogprobs:
        if (!cancel_all_.load()) run->sink->OnPromptLogprobs(e.prompt_logprobs);
        return true;
      case DecodeEvent::Kind::kFinish: run->finish = e.finish; return true;
      case DecodeEvent::Kind::kError: run->error = e.error; return true;
    }
    return true;
  };
  bool connection_failed = false;
  const Status st = client->Decode(call, run->r.deadline, on_event, &connection_failed);
  if (st.ok() || run->finish || run->cancelled || run->fall_back_local) return;
  if (st.code() == StatusCode::kResourceExhausted && run->tokens == 0) {
    run->retry_kv = true;  // no KV room on the decode worker after all
    return;
  }
  if (st.code() == StatusCode::kFailedPrecondition && run->tokens == 0) {
    // The worker no longer decodes (its role was switched by someone else than this
    // conductor): place the request again, without it until its next heartbeat shows its role.
    log_->info("{}: {} does not decode now; placing again", run->r.id, run->decode);
    Suspect(run->decode);
    run->retry_kv = true;
    return;
  }
  if (run->error.ok()) {
    if (connection_failed) Suspect(run->decode);
    run->error = st.WithContext("decode worker " + run->decode);
  }
}

}  // namespace tandem::conductor::internal
