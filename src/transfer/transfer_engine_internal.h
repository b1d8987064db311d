// Private to transfer_engine*.cc: the engine's internal types (worker pool, registered regions,
// opened segments, batch and request state) and the TransferEngineImpl class they implement
// together (transfer_engine.cc, transfer_engine_segments.cc, transfer_engine_batch.cc).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transfer/shm_transport.h"
#include "transfer/tcp_transport.h"
#include "transfer/transfer_engine.h"
#include "transfer/transfer_util.h"
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

  bool Run(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        queue_.push_back(std::move(fn));
        cv_.notify_one();
        return true;
      }
    }
    fn();
    return false;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

// Registered local memory; a published segment when info.segment_name is set.
struct Region {
  LocalRegion info;
  std::atomic<bool> retiring{false};
  SharedMemory shm;  // AllocateSegment only; unmapped when the last user lets go
  std::string metadata_key;  // published segments only
};

struct OpenedSegment {
  SegmentDescriptor desc;
  Protocol protocol = Protocol::kTcp;
  Transport* transport = nullptr;
  std::shared_ptr<RemoteSegment> remote;
  std::mutex notify_mu;
  std::shared_ptr<RemoteSegment> notify_remote;  // over TCP; opened on the first notification
};

struct RequestState {
  std::atomic<int> state{static_cast<int>(TransferState::kPending)};
  std::atomic<uint32_t> slices_left{0};
  std::mutex error_mu;
  Status slice_error;  // first failing slice; guarded by error_mu
  Status error;        // final; written before the terminal state is published
  OpCode op = OpCode::kWrite;
  uint64_t length = 0;
};

struct Batch {
  BatchId id = 0;
  Clock::time_point deadline;
  std::string notification;
  size_t size = 0;
  std::unique_ptr<RequestState[]> requests;
  std::atomic<size_t> pending{0};         // requests not yet terminal
  std::atomic<size_t> not_completed{0};   // requests that ended failed or timed out
  std::shared_ptr<OpenedSegment> target;  // for the notification
  std::atomic<bool> notify_started{false};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool done = false;    // guarded by mu: requests terminal and notification settled
  Status notify_error;  // guarded by mu
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
                                Clock::time_point deadline, std::string notification) override;
  RequestStatus GetRequestStatus(BatchId batch, size_t index) const override;
  BatchStatus GetBatchStatus(BatchId batch) const override;
  BatchStatus WaitBatch(BatchId batch) override;
  Status FreeBatch(BatchId batch) override;
  void SetNotificationHandler(std::function<void(const Notification&)> handler) override;
  TransferCounters Counters() const override;
  const std::string& local_name() const override { return options_.local_name; }

  // TransportHost.
  bool RunOnWorker(std::function<void()> fn) override { return workers_.Run(std::move(fn)); }
  std::shared_ptr<const LocalRegion> FindSegment(const std::string& name) override;
  void DeliverNotification(const Notification& notification) override;
  void AddBytesServed(uint64_t bytes) override {
    bytes_served_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  Status Publish(const std::string& name, std::shared_ptr<Region> region);
  // Whether [p, p + len) lies inside registered memory; the region if so. Caller holds mem_mu_.
  std::shared_ptr<Region> FindLocal(const void* p, uint64_t len) const;
  bool Overlaps(const void* p, uint64_t len) const;
  std::shared_ptr<Batch> LookupBatch(BatchId id) const;
  Transport* TransportFor(Protocol p) const;

  void OnSliceDone(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  // Moves request `index` from kPending to its terminal state; false if it was not pending.
  bool Finish(const std::shared_ptr<Batch>& batch, size_t index, Status st);
  void OnRequestsDone(const std::shared_ptr<Batch>& batch);
  void SettleBatch(const std::shared_ptr<Batch>& batch, Status notify_error);
  // Forces every request still pending at deadline + kReapSlack to kTimedOut (and an unsettled
  // notification to a failure). Safe to race with late completions.
  void Reap(const std::shared_ptr<Batch>& batch);
  void ReaperLoop();
  BatchStatus Summarize(const Batch& batch) const;

  const TransferEngineOptions options_;
  std::string host_id_;
  WorkerPool workers_;
  // Transports, destroyed before the registries they call back into.
  std::vector<std::unique_ptr<Transport>> transports_;
  TcpTransport* tcp_ = nullptr;  // also in transports_; carries notifications

  mutable std::shared_mutex mem_mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;            // by base; guarded by mem_mu_
  std::map<std::string, std::shared_ptr<Region>> segments_;         // by name; guarded by mem_mu_

  mutable std::shared_mutex open_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenedSegment>> opened_;  // guarded by open_mu_
  uint64_t next_handle_ = 1;                                          // guarded by open_mu_

  mutable std::mutex batch_mu_;
  std::condition_variable reaper_cv_;
  std::unordered_map<BatchId, std::shared_ptr<Batch>> batches_;  // guarded by batch_mu_
  BatchId next_batch_ = 1;                                       // guarded by batch_mu_
  bool stopping_ = false;                                        // guarded by batch_mu_
  std::atomic<bool> shutting_down_{false};
  std::thread reaper_;

  std::mutex handler_mu_;
  std::function<void(const Notification&)> handler_;  // guarded by handler_mu_

  std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0}, requests_completed_{0},
      requests_failed_{0}, requests_timed_out_{0}, requests_refused_{0}, bytes_served_{0},
      notifications_sent_{0}, notifications_received_{0};
};

}  // namespace tandem::transfer::internal
