// TransferEngineImpl: batch validation and submission, per-request state machines, deadlines
// (the reaper) and batch status.
#include <algorithm>

#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/transfer_engine_internal.h"
#include "transfer/transfer_util_internal.h"

namespace tandem::transfer::internal {
namespace {

constexpr uint64_t kMaxNotificationBytes = 64 << 10;

// Internal request state between kPending and a terminal state: the winner of the CAS out of
// kPending writes the error, then publishes the terminal state.
constexpr int kFinishing = 100;

// t + kReapSlack without overflowing for far-future deadlines (e.g. time_point::max()).
Clock::time_point ReapTime(Clock::time_point t) {
  return t > Clock::time_point::max() - kReapSlack ? Clock::time_point::max() : t + kReapSlack;
}

TransferState StateFor(const Status& st) {
  if (st.ok()) return TransferState::kCompleted;
  if (st.code() == StatusCode::kDeadlineExceeded) return TransferState::kTimedOut;
  return TransferState::kFailed;
}

}  // namespace

// ---- Batches -------------------------------------------------------------------------------

StatusOr<BatchId> TransferEngineImpl::SubmitBatch(std::span<const TransferRequest> requests,
                                                  Clock::time_point deadline,
                                                  std::string notification) {
  auto refuse = [&](Status st) -> StatusOr<BatchId> {
    requests_refused_.fetch_add(std::max<size_t>(requests.size(), 1), std::memory_order_relaxed);
    return st;
  };
  if (shutting_down_.load(std::memory_order_acquire))
    return refuse(Cancelled("engine shutting down"));
  if (requests.empty()) return refuse(InvalidArgument("empty batch"));
  if (notification.size() > kMaxNotificationBytes) {
    return refuse(InvalidArgument("notification of " + std::to_string(notification.size()) +
                                  " bytes exceeds " + std::to_string(kMaxNotificationBytes)));
  }
  // Validate everything before anything starts.
  std::vector<std::shared_ptr<OpenedSegment>> targets(requests.size());
  std::vector<std::shared_ptr<Region>> locals(requests.size());
  {
    std::shared_lock<std::shared_mutex> open_lock(open_mu_);
    std::shared_lock<std::shared_mutex> mem_lock(mem_mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      const TransferRequest& r = requests[i];
      const std::string where = "request " + std::to_string(i) + ": ";
      if (r.op != OpCode::kRead && r.op != OpCode::kWrite) {
        return refuse(InvalidArgument(where + "unknown op code"));
      }
      if (r.length == 0) return refuse(InvalidArgument(where + "zero length"));
      auto it = opened_.find(r.segment.id);
      if (it == opened_.end()) {
        return refuse(NotFound(where + "unknown segment handle " + std::to_string(r.segment.id)));
      }
      const SegmentDescriptor& d = it->second->desc;
      if (r.remote_offset > d.size || r.length > d.size - r.remote_offset) {
        return refuse(OutOfRange(where + "remote range [" + std::to_string(r.remote_offset) +
                                 ", +" + std::to_string(r.length) + ") outside segment '" + d.name +
                                 "' of " + std::to_string(d.size) + " bytes"));
      }
      if (r.local == nullptr) return refuse(InvalidArgument(where + "null local address"));
      locals[i] = FindLocal(r.local, r.length);
      if (locals[i] == nullptr) {
        return refuse(InvalidArgument(where + "local range of " + std::to_string(r.length) +
                                      " bytes is not inside memory registered with this engine"));
      }
      if (!notification.empty() && i > 0 && r.segment.id != requests[0].segment.id) {
        return refuse(InvalidArgument(where +
                                      "a batch with a notification must target one "
                                      "segment; requests 0 and " +
                                      std::to_string(i) + " differ"));
      }
      targets[i] = it->second;
    }
  }
  auto batch = std::make_shared<Batch>();
  batch->deadline = deadline;
  batch->notification = std::move(notification);
  batch->size = requests.size();
  batch->requests = std::make_unique<RequestState[]>(requests.size());
  batch->pending.store(requests.size());
  // Count slices before anything can complete (or the reaper can see the batch).
  for (size_t i = 0; i < requests.size(); ++i) {
    const uint64_t slice = std::max<uint64_t>(targets[i]->transport->caps().slice_bytes, 4096);
    RequestState& rs = batch->requests[i];
    rs.op = requests[i].op;
    rs.length = requests[i].length;
    rs.slices_left.store(static_cast<uint32_t>((requests[i].length + slice - 1) / slice));
  }
  if (!batch->notification.empty()) {
    const std::shared_ptr<OpenedSegment>& target = targets[0];
    {
      MutexLock lock(&target->notify_mu);
      if (target->notify_remote == nullptr) {
        // Notifications always travel over TCP to the owner's listener.
        auto remote = tcp_->Open(target->desc);
        if (!remote.ok()) {
          return refuse(
              remote.status().WithContext("notification path to '" + target->desc.name + "'"));
        }
        target->notify_remote = std::move(*remote);
      }
    }
    // No other thread sees the batch yet; the lock is for the annotations (uncontended).
    MutexLock lock(&batch->mu);
    batch->target = target;
  }
  {
    MutexLock lock(&batch_mu_);
    batch->id = next_batch_++;
    batches_[batch->id] = batch;
  }
  reaper_cv_.NotifyAll();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    const uint64_t slice = std::max<uint64_t>(targets[i]->transport->caps().slice_bytes, 4096);
    for (uint64_t off = 0; off < r.length; off += slice) {
      TransferRequest part = r;
      part.local = static_cast<char*>(r.local) + off;
      part.remote_offset = r.remote_offset + off;
      part.length = std::min(slice, r.length - off);
      // The callback keeps the remote segment (e.g. its mapping) and the local region alive
      // until the transport reports the slice, and lets go of them before the request can be
      // seen finished: once WaitBatch returned and the segment is closed, it is unmapped.
      targets[i]->transport->Submit(
          *targets[i]->remote, part, deadline,
          [this, batch, i, remote = targets[i]->remote, local = locals[i]](Status st) mutable {
            remote.reset();
            local.reset();
            OnSliceDone(batch, i, std::move(st));
          });
    }
  }
  return batch->id;
}

void TransferEngineImpl::OnSliceDone(const std::shared_ptr<Batch>& batch, size_t index, Status st) {
  RequestState& rs = batch->requests[index];
  if (!st.ok()) {
    MutexLock lock(&rs.error_mu);
    if (rs.slice_error.ok()) rs.slice_error = std::move(st);
  }
  if (rs.slices_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Status final_status;
  {
    MutexLock lock(&rs.error_mu);
    final_status = rs.slice_error;
  }
  if (!Finish(batch, index, std::move(final_status))) {
    GetLogger("transfer")
        ->warn(
            "batch {} request {}: transport reported after the engine had "
            "timed the request out",
            batch->id, index);
  }
}

bool TransferEngineImpl::Finish(const std::shared_ptr<Batch>& batch, size_t index, Status st) {
  RequestState& rs = batch->requests[index];
  int expected = static_cast<int>(TransferState::kPending);
  if (!rs.state.compare_exchange_strong(expected, kFinishing, std::memory_order_acq_rel)) {
    return false;
  }
  const TransferState final_state = StateFor(st);
  rs.error = std::move(st);
  switch (final_state) {
    case TransferState::kCompleted:
      requests_completed_.fetch_add(1, std::memory_order_relaxed);
      (rs.op == OpCode::kWrite ? bytes_written_ : bytes_read_)
          .fetch_add(rs.length, std::memory_order_relaxed);
      break;
    case TransferState::kTimedOut:
      requests_timed_out_.fetch_add(1, std::memory_order_relaxed);
      batch->not_completed.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      requests_failed_.fetch_add(1, std::memory_order_relaxed);
      batch->not_completed.fetch_add(1, std::memory_order_relaxed);
      break;
  }
  rs.state.store(static_cast<int>(final_state), std::memory_order_release);
  if (batch->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) OnRequestsDone(batch);
  return true;
}

void TransferEngineImpl::OnRequestsDone(const std::shared_ptr<Batch>& batch) {
  if (batch->notification.empty() || batch->not_completed.load() > 0) {
    SettleBatch(batch, OkStatus());
    return;
  }
  if (batch->notify_started.exchange(true)) return;
  if (shutting_down_.load(std::memory_order_acquire) || Clock::now() > batch->deadline) {
    SettleBatch(batch, shutting_down_.load()
                           ? Cancelled("engine shutting down; notification not sent")
                           : DeadlineExceeded("notification not sent: deadline passed"));
    return;
  }
  std::shared_ptr<OpenedSegment> target;
  {
    MutexLock lock(&batch->mu);
    if (batch->done) return;  // settled meanwhile (reaped or shut down)
    target = batch->target;
  }
  std::shared_ptr<RemoteSegment> remote;
  {
    MutexLock lock(&target->notify_mu);
    remote = target->notify_remote;
  }
  target.reset();
  tcp_->Notify(*remote, options_.local_name, batch->notification, batch->deadline,
               [this, batch, remote](Status st) mutable {
                 remote.reset();
                 if (st.ok()) notifications_sent_.fetch_add(1, std::memory_order_relaxed);
                 SettleBatch(batch, st.ok() ? st : st.WithContext("notification"));
               });
}

void TransferEngineImpl::SettleBatch(const std::shared_ptr<Batch>& batch, Status notify_error) {
  {
    MutexLock lock(&batch->mu);
    if (batch->done) return;
    batch->done = true;
    batch->notify_error = std::move(notify_error);
    // A settled batch holds no segment: closing the handle then releases it at once.
    batch->target.reset();
  }
  batch->cv.NotifyAll();
}

void TransferEngineImpl::Reap(const std::shared_ptr<Batch>& batch) {
  bool forced = false;
  for (size_t i = 0; i < batch->size; ++i) {
    if (batch->requests[i].state.load(std::memory_order_acquire) ==
        static_cast<int>(TransferState::kPending)) {
      forced |=
          Finish(batch, i,
                 DeadlineExceeded("no completion within " + std::to_string(kReapSlack.count()) +
                                  " ms after the deadline"));
    }
  }
  if (forced) {
    GetLogger("transfer")
        ->error(
            "batch {}: transport missed the deadline; requests forced to "
            "timed out",
            batch->id);
  }
  // Requests may still be finishing on another thread (between the CAS and the count); a
  // settled notification is only forced once none is pending.
  if (batch->pending.load(std::memory_order_acquire) == 0) {
    SettleBatch(batch, DeadlineExceeded("notification not acknowledged by the deadline"));
  }
}

void TransferEngineImpl::ReaperLoop() {
  MutexLock lock(&batch_mu_);
  while (!stopping_) {
    const auto now = Clock::now();
    auto next = now + std::chrono::milliseconds(200);
    std::vector<std::shared_ptr<Batch>> due;
    for (auto& [id, batch] : batches_) {
      {
        MutexLock block(&batch->mu);
        if (batch->done) continue;
      }
      const auto reap_at = ReapTime(batch->deadline);
      if (reap_at <= now) {
        due.push_back(batch);
      } else {
        next = std::min(next, reap_at);
      }
    }
    if (!due.empty()) {
      batch_mu_.Unlock();  // Reap takes Batch::mu and runs completions
      for (auto& b : due) Reap(b);
      batch_mu_.Lock();
      continue;
    }
    reaper_cv_.WaitUntil(&batch_mu_, next);
  }
}

std::shared_ptr<Batch> TransferEngineImpl::LookupBatch(BatchId id) const {
  MutexLock lock(&batch_mu_);
  auto it = batches_.find(id);
  return it == batches_.end() ? nullptr : it->second;
}

BatchStatus TransferEngineImpl::Summarize(const Batch& batch) const {
  BatchStatus s;
  Status first_error;
  for (size_t i = 0; i < batch.size; ++i) {
    const int st = batch.requests[i].state.load(std::memory_order_acquire);
    switch (st) {
      case static_cast<int>(TransferState::kCompleted): ++s.completed; break;
      case static_cast<int>(TransferState::kFailed): ++s.failed; break;
      case static_cast<int>(TransferState::kTimedOut): ++s.timed_out; break;
      default: ++s.pending; break;  // pending or finishing
    }
    if ((st == static_cast<int>(TransferState::kFailed) ||
         st == static_cast<int>(TransferState::kTimedOut)) &&
        first_error.ok()) {
      first_error = batch.requests[i].error;
    }
  }
  bool done = false;
  Status notify_error;
  {
    MutexLock lock(&batch.mu);
    done = batch.done;
    notify_error = batch.notify_error;
  }
  if (s.pending > 0 || !done) {
    s.state = TransferState::kPending;
  } else if (s.failed > 0) {
    s.state = TransferState::kFailed;
  } else if (s.timed_out > 0) {
    s.state = TransferState::kTimedOut;
  } else if (!notify_error.ok()) {
    s.state = StateFor(notify_error);
    first_error = notify_error;
  } else {
    s.state = TransferState::kCompleted;
  }
  s.first_error = first_error;
  return s;
}

RequestStatus TransferEngineImpl::GetRequestStatus(BatchId id, size_t index) const {
  RequestStatus r;
  auto batch = LookupBatch(id);
  if (batch == nullptr || index >= batch->size) {
    r.state = TransferState::kFailed;
    r.error = NotFound("unknown batch " + std::to_string(id) + " or request index " +
                       std::to_string(index));
    return r;
  }
  const int st = batch->requests[index].state.load(std::memory_order_acquire);
  if (st == kFinishing || st == static_cast<int>(TransferState::kPending)) return r;
  r.state = static_cast<TransferState>(st);
  r.error = batch->requests[index].error;
  return r;
}

BatchStatus TransferEngineImpl::GetBatchStatus(BatchId id) const {
  auto batch = LookupBatch(id);
  if (batch == nullptr) {
    BatchStatus s;
    s.state = TransferState::kFailed;
    s.first_error = NotFound("unknown batch " + std::to_string(id));
    return s;
  }
  return Summarize(*batch);
}

BatchStatus TransferEngineImpl::WaitBatch(BatchId id) {
  auto batch = LookupBatch(id);
  if (batch == nullptr) return GetBatchStatus(id);
  // The predicate runs inside CondVar's wait, with batch->mu held.
  auto done = [&] {
    batch->mu.AssertHeld();
    return batch->done;
  };
  {
    MutexLock lock(&batch->mu);
    batch->cv.WaitUntil(&batch->mu, ReapTime(batch->deadline), done);
  }
  Reap(batch);  // no-op unless the transports missed the deadline
  {
    // Reap may have raced with a request finishing on another thread; that thread settles the
    // batch within microseconds, and the bound here keeps WaitBatch finite regardless.
    MutexLock lock(&batch->mu);
    batch->cv.WaitFor(&batch->mu, std::chrono::milliseconds(50), done);
  }
  return Summarize(*batch);
}

Status TransferEngineImpl::FreeBatch(BatchId id) {
  MutexLock lock(&batch_mu_);
  auto it = batches_.find(id);
  if (it == batches_.end()) return NotFound("unknown batch " + std::to_string(id));
  {
    MutexLock block(&it->second->mu);
    if (!it->second->done) {
      return FailedPrecondition("batch " + std::to_string(id) + " still has pending requests");
    }
  }
  batches_.erase(it);
  return OkStatus();
}

}  // namespace tandem::transfer::internal
