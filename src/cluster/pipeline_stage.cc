#include "cluster/pipeline_stage.h"

#include <algorithm>
#include <memory>

#include "engine/sampler.h"

namespace tandem::cluster {

// ---- StageInbox ----

StageInbox::Session& StageInbox::SessionLocked(const std::string& id) {
  Session& s = sessions_[id];
  s.touched = Clock::now();
  return s;
}

void StageInbox::DropStaleLocked() {
  const Clock::time_point now = Clock::now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second.open && now - it->second.touched > kStaleAfter) {
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

void StageInbox::Open(const std::string& id) {
  MutexLock lock(&mu_);
  DropStaleLocked();
  SessionLocked(id).open = true;
}

Status StageInbox::Put(StageInput in, Clock::time_point deadline) {
  MutexLock lock(&mu_);
  DropStaleLocked();
  const std::string id = in.id;
  Session* s = &SessionLocked(id);
  if (!s->failed.ok()) return s->failed;
  s->queued.push_back(std::move(in));
  cv_.NotifyAll();
  // Backpressure: the sender goes on once the stage has room for its next chunk.
  cv_.WaitUntil(&mu_, deadline, [&] {
    mu_.AssertHeld();
    auto it = sessions_.find(id);
    return it == sessions_.end() || !it->second.failed.ok() ||
           it->second.queued.size() <= kMaxQueued;
  });
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return OkStatus();  // the stage ended (its chunks were taken)
  if (!it->second.failed.ok()) return it->second.failed;
  return OkStatus();
}

StatusOr<StageInput> StageInbox::Take(const std::string& id, Clock::time_point deadline) {
  MutexLock lock(&mu_);
  const bool ready = cv_.WaitUntil(&mu_, deadline, [&] {
    mu_.AssertHeld();
    const Session& s = sessions_[id];
    return !s.queued.empty() || !s.failed.ok();
  });
  Session& s = SessionLocked(id);
  if (!s.failed.ok()) return s.failed;
  if (!ready) return DeadlineExceeded("the previous pipeline stage sent nothing in time");
  StageInput in = std::move(s.queued.front());
  s.queued.erase(s.queued.begin());
  cv_.NotifyAll();  // a sender waits for room
  if (!in.error.ok()) return in.error.WithContext("the previous pipeline stage failed");
  return in;
}

void StageInbox::Fail(const std::string& id, const Status& why) {
  MutexLock lock(&mu_);
  Session& s = SessionLocked(id);
  s.failed = why;
  s.queued.clear();
  cv_.NotifyAll();
}

Status StageInbox::Failed(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? OkStatus() : it->second.failed;
}

void StageInbox::Close(const std::string& id) {
  MutexLock lock(&mu_);
  sessions_.erase(id);
  cv_.NotifyAll();
}

// ---- one stage ----

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// What the engine-loop work of one stage shares with the stage's thread. Owned by both (a
// RunExclusive call the thread gave up on may still run).
struct StageState {
  std::vector<int32_t> blocks;  // the whole prompt's, position order
  std::vector<float> hidden;    // this chunk's output
  std::vector<float> logits;    // the last stage's, after the last chunk
};

}  // namespace

StatusOr<StageOutcome> RunPipelineStage(
    const StageRun& run, serving::LocalBackend& backend, KvPusher& pusher, StageInbox& inbox,
    const std::function<Status(const StageInput&)>& send_next,
    const std::function<std::string(const engine::SampledToken&)>& notify) {
  const PipelineStage& stage = run.stage;
  const int n_prompt = static_cast<int>(run.prompt.size());
  auto state = std::make_shared<StageState>();
  StageOutcome out;
  inbox.Open(run.session);

  auto compute = [&]() -> Status {
    for (int start = 0; start < n_prompt; start += stage.chunk_tokens) {
      TANDEM_RETURN_IF_ERROR(inbox.Failed(run.session));
      const int n = std::min(stage.chunk_tokens, n_prompt - start);
      const bool last_chunk = start + n == n_prompt;
      std::vector<float> input;
      if (stage.index > 0) {
        const Clock::time_point waiting = Clock::now();
        TANDEM_ASSIGN_OR_RETURN(StageInput in, inbox.Take(run.session, run.deadline));
        out.wait_seconds += Seconds(Clock::now() - waiting);
        if (in.start != start || in.n != n) {
          return Internal("pipeline stage " + std::to_string(stage.index) + " expected positions " +
                          std::to_string(start) + ".." + std::to_string(start + n) + ", got " +
                          std::to_string(in.start) + ".." + std::to_string(in.start + in.n));
        }
        input = std::move(in.hidden);
      }
      const Clock::time_point computing = Clock::now();
      const std::span<const int32_t> tokens(run.prompt.data() + start, n);
      TANDEM_RETURN_IF_ERROR(backend.RunExclusive(
          [&, state, tokens, start, n,
           last_chunk](serving::LocalBackend::ExclusiveAccess& access) -> Status {
            engine::PagedKvCache& kv = access.engine().kv();
            if (state->blocks.empty()) {
              auto got = access.AllocateBlocks(kv.BlocksFor(n_prompt));
              if (!got.ok()) {
                return got.status().WithContext("a pipeline stage of " + std::to_string(n_prompt) +
                                                " tokens");
              }
              state->blocks = std::move(*got);
            }
            TANDEM_RETURN_IF_ERROR(access.AttachWindow(state->blocks, start, start + n));
            engine::Transformer& tf = access.engine().transformer();
            tf.SetLayerDoneCallback(
                [&](int layer) { pusher.OnLayerWritten(layer, state->blocks, start, start + n); });
            engine::BatchItem item{state->blocks, start, tokens, last_chunk};
            const Status st = tf.ForwardLayers({&item, 1}, kv, stage.begin_layer, stage.end_layer,
                                               input, &state->hidden, &state->logits);
            tf.SetLayerDoneCallback(nullptr);
            // The window the decode side reads (the last one) is never taken back here: only
            // blocks wholly before the window of start + n go.
            kv.TrimWindow(state->blocks, start + n);
            return st;
          },
          n, run.deadline));
      out.compute_seconds += Seconds(Clock::now() - computing);
      if (stage.last()) continue;
      // The next stage's last chunk ends the prefill: this stage's KV must be there by then.
      if (last_chunk) TANDEM_RETURN_IF_ERROR(pusher.Flush());
      StageInput next;
      next.id = run.session;
      next.start = start;
      next.n = n;
      next.last = last_chunk;
      next.hidden = std::move(state->hidden);
      TANDEM_RETURN_IF_ERROR(send_next(next));
      out.bytes_sent += next.hidden.size() * sizeof(float);
    }
    if (!stage.last()) return OkStatus();
    const auto ends = backend.engine().tokenizer().EndOfGenerationIds();
    engine::Sampler sampler(run.sampling, run.prompt, ends);
    out.first_token = sampler.Sample(state->logits);
    return pusher.Finish(notify(out.first_token));
  };
  Status st = compute();
  if (!st.ok() && !stage.last()) {
    StageInput failed;
    failed.id = run.session;
    failed.error = st;
    (void)send_next(failed);  // best effort: the conductor cancels the rest too
  }
  inbox.Close(run.session);
  if (!state->blocks.empty()) {
    // Once no batch reads them any more (Flush waits for every one), freed on the loop (the
    // allocator is its own), whatever the request's deadline.
    (void)pusher.Flush();
    const Status freed = backend.RunExclusive(
        [state](serving::LocalBackend::ExclusiveAccess& access) {
          access.engine().kv().Release(state->blocks);
          state->blocks.clear();
          return OkStatus();
        },
        0, Clock::now() + std::chrono::minutes(5));
    if (st.ok()) st = freed;
  }
  if (!st.ok()) return st;
  return out;
}

}  // namespace tandem::cluster
