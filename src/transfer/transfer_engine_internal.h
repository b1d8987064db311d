// Private to transfer_engine*.cc: the engine's internal types (worker pool, registered regions,
// opened segments, batch and request state) and the TransferEngineImpl class they implement
// together (transfer_engine.cc, transfer_engine_segments.cc, transfer_engine_batch.cc).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "transfer/shm_transport.h"
#include "transfer/tcp_transport.h"
#include "transfer/transfer_engine.h"
#include "transfer/transfer_util_internal.h"
#include "transfer/transport.h"

namespace tandem::transfer::internal {

// Worker threads for copies (shm). FIFO; Stop runs what is still queued, and later calls run
// the function inline, so every function runs exactly once.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() { Stop(); }

  bool Run(std::function<void()> fn) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (!stopping_) {
        queue_.push_back(std::move(fn));
        cv_.NotifyOne();
        return true;
      }
    }
    fn();
    return false;
  }

  void Stop() TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.NotifyAll();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() TANDEM_EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
        if (queue_.empty()) return;  // stopping and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ TANDEM_GUARDED_BY(mu_);
  bool stopping_ TANDEM_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // started by the constructor, joined by Stop
};

// Registered local memory; a published segment when info.segment_name is set.
struct Region {
  LocalRegion info;
  std::atomic<bool> retiring{false};
  SharedMemory shm;          // AllocateSegment only; unmapped when the last user lets go
  std::string metadata_key;  // published segments only
};

struct OpenedSegment {
  SegmentDescriptor desc;
  Protocol protocol = Protocol::kTcp;
  Transport* transport = nullptr;
  std::shared_ptr<RemoteSegment> remote;
  Mutex notify_mu;
  // Over TCP; opened on the first notification (or set to `remote` for TCP segments by
  // OpenSegment, before the segment is shared).
  std::shared_ptr<RemoteSegment> notify_remote TANDEM_GUARDED_BY(notify_mu);
};

struct RequestState {
  std::atomic<int> state{static_cast<int>(TransferState::kPending)};
  std::atomic<uint32_t> slices_left{0};
  Mutex error_mu;
  Status slice_error TANDEM_GUARDED_BY(error_mu);  // first failing slice
  // Final. Not guarded: written only by the thread that won the CAS of `state` out of kPending,
  // before it publishes the terminal state (release); read only after seeing that state.
  Status error;
  OpCode op = OpCode::kWrite;
  uint64_t length = 0;
};

struct Batch {
  BatchId id = 0;
  Clock::time_point deadline;
  std::string notification;
  size_t size = 0;
  std::unique_ptr<RequestState[]> requests;
  std::atomic<size_t> pending{0};        // requests not yet terminal
  std::atomic<size_t> not_completed{0};  // requests that ended failed or timed out
  // For the notification; reset when the batch settles.
  std::shared_ptr<OpenedSegment> target TANDEM_GUARDED_BY(mu);
  std::atomic<bool> notify_started{false};

  mutable Mutex mu;
  CondVar cv;
  bool done TANDEM_GUARDED_BY(mu) = false;  // requests terminal and notification settled
  Status notify_error TANDEM_GUARDED_BY(mu);
};

class TransferEngineImpl final : public TransferEngine, public TransportHost {
 public:
  explicit TransferEngineImpl(TransferEngineOptions options)
      : options_(std::move(options)), workers_(options_.worker_threads) {}

  ~TransferEngineImpl() override;

  Status Init();

  // TransferEngine.
  StatusOr<void*> AllocateSegment(const std::string& name, uint64_t size) override;
  Status RegisterSegment(const std::string& name, void* base, uint64_t size) override;
  Status UnregisterSegment(const std::string& name) override;
  Status RegisterLocalMemory(void* base, uint64_t size) override;
  Status UnregisterLocalMemory(void* base) override;
  StatusOr<SegmentHandle> OpenSegment(const std::string& name) override;
  Status CloseSegment(SegmentHandle handle) override;
  StatusOr<Protocol> SegmentProtocol(SegmentHandle handle) const override;
  StatusOr<BatchId> SubmitBatch(std::span<const TransferRequest> requests,
                                Clock::time_point deadline, std::string notification) override
      TANDEM_EXCLUDES(batch_mu_);
  RequestStatus GetRequestStatus(BatchId batch, size_t index) const override
      TANDEM_EXCLUDES(batch_mu_);
  BatchStatus GetBatchStatus(BatchId batch) const override TANDEM_EXCLUDES(batch_mu_);
  BatchStatus WaitBatch(BatchId batch) override TANDEM_EXCLUDES(batch_mu_);
  Status FreeBatch(BatchId batch) override TANDEM_EXCLUDES(batch_mu_);
  void SetNotificationHandler(std::function<void(const Notification&)> handler) override
      TANDEM_EXCLUDES(handler_mu_);
  TransferCounters Counters() const override;
  const std::string& local_name() const override { return options_.local_name; }

  // TransportHost.
  bool RunOnWorker(std::function<void()> fn) override { return workers_.Run(std::move(fn)); }
  std::shared_ptr<const LocalRegion> FindSegment(const std::string& name) override;
  void DeliverNotification(const Notification& notification) override TANDEM_EXCLUDES(handler_mu_);
  void AddBytesServed(uint64_t bytes) override {
    bytes_served_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  Status Publish(const std::string& name, std::shared_ptr<Region> region);
  // Whether [p, p + len) lies inside registered memory; the region if so. Caller holds mem_mu_
  // (shared or exclusive; not annotated, see mem_mu_).
  std::shared_ptr<Region> FindLocal(const void* p, uint64_t len) const;
  bool Overlaps(const void* p, uint64_t len) const;  // caller holds mem_mu_
  std::shared_ptr<Batch> LookupBatch(BatchId id) const TANDEM_EXCLUDES(batch_mu_);
  Transport* TransportFor(Protocol p) const;

  void OnSliceDone(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  // Moves request `index` from kPending to its terminal state; false if it was not pending.
  bool Finish(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  void OnRequestsDone(const std::shared_ptr<Batch>& batch);
  void SettleBatch(const std::shared_ptr<Batch>& batch, Status notify_error);
  // Forces every request still pending at deadline + kReapSlack to kTimedOut (and an unsettled
  // notification to a failure). Safe to race with late completions.
  void Reap(const std::shared_ptr<Batch>& batch);
  void ReaperLoop() TANDEM_EXCLUDES(batch_mu_);
  BatchStatus Summarize(const Batch& batch) const;

  const TransferEngineOptions options_;
  std::string host_id_;
  WorkerPool workers_;
  // Transports, destroyed before the registries they call back into.
  std::vector<std::unique_ptr<Transport>> transports_;
  TcpTransport* tcp_ = nullptr;  // also in transports_; carries notifications

  // mem_mu_ and open_mu_ are reader/writer locks (lookups on the submit path run in parallel).
  // tandem::Mutex has no shared mode, so they stay std::shared_mutex and what they guard is not
  // annotated (clang cannot check std::shared_mutex); the rule still holds: touch the members
  // below only with the lock held, shared for reading, exclusive for writing.
  mutable std::shared_mutex mem_mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;     // by base; guarded by mem_mu_
  std::map<std::string, std::shared_ptr<Region>> segments_;  // by name; guarded by mem_mu_

  mutable std::shared_mutex open_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenedSegment>> opened_;  // guarded by open_mu_
  uint64_t next_handle_ = 1;                                             // guarded by open_mu_

  // Lock order: batch_mu_ before Batch::mu (the reaper, FreeBatch and the destructor).
  mutable Mutex batch_mu_;
  CondVar reaper_cv_;
  std::unordered_map<BatchId, std::shared_ptr<Batch>> batches_ TANDEM_GUARDED_BY(batch_mu_);
  BatchId next_batch_ TANDEM_GUARDED_BY(batch_mu_) = 1;
  bool stopping_ TANDEM_GUARDED_BY(batch_mu_) = false;
  std::atomic<bool> shutting_down_{false};
  std::thread reaper_;

  Mutex handler_mu_;
  std::function<void(const Notification&)> handler_ TANDEM_GUARDED_BY(handler_mu_);

  std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0}, requests_completed_{0},
      requests_failed_{0}, requests_timed_out_{0}, requests_refused_{0}, bytes_served_{0},
      notifications_sent_{0}, notifications_received_{0};
};

}  // namespace tandem::transfer::internal
