// Internal to src/transfer: the interface every transport implements. The engine validates
// requests, tracks their states and deadlines, and hands valid ones to the transport chosen
// for the target segment. Requests longer than TransportCaps::slice_bytes reach the transport
// as several slices (each a TransferRequest of its own); the request ends when all did.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "transfer/transfer_engine.h"

namespace tandem::transfer {

struct TransportCaps {
  bool same_host_only = false;       // shm
  bool zero_copy = false;            // data moves without staging copies in our code
  bool needs_shared_memory = false;  // target segment must be memfd-backed (AllocateSegment)
  uint64_t slice_bytes = 1 << 20;    // the engine splits longer requests into slices this big
};

// A local registered region as the transports see it.
struct LocalRegion {
  std::string segment_name;  // empty: local memory only, not published
  void* base = nullptr;
  uint64_t size = 0;
  int memfd = -1;  // >= 0 when allocated by AllocateSegment
  // Set once UnregisterSegment began: a transport serving this region as target stops at the
  // next chance (between socket reads) instead of writing into memory about to be released.
  const std::atomic<bool>* retiring = nullptr;
};

// What the engine offers its transports. Outlives every transport (the engine destroys its
// transports first). All methods are thread-safe.
class TransportHost {
 public:
  virtual ~TransportHost() = default;
  virtual const std::string& local_name() const = 0;
  // Queues fn on one of the engine's worker threads (FIFO). fn runs exactly once: on a worker
  // (true), or inline on the caller once the workers stopped (false); a transport's fn checks
  // its own stop flag.
  virtual bool RunOnWorker(std::function<void()> fn) = 0;
  // A segment published by this engine, by name; nullptr if none. The memory stays mapped and
  // registered while the returned pointer lives (UnregisterSegment waits for it, bounded).
  virtual std::shared_ptr<const LocalRegion> FindSegment(const std::string& name) = 0;
  // Hands a received notification to the user's handler (on the calling thread).
  virtual void DeliverNotification(const Notification& notification) = 0;
  // Counts bytes moved as target (remote writes into, reads from our segments).
  virtual void AddBytesServed(uint64_t bytes) = 0;
};

// A remote segment opened by one transport. Owned by the engine's handle table; shared with
// the completion callbacks of requests in flight, so it outlives every Submit made on it.
class RemoteSegment {
 public:
  virtual ~RemoteSegment() = default;
  virtual const SegmentDescriptor& descriptor() const = 0;
};

// Called exactly once per request by the transport, from any thread; it may run inline inside
// Submit (e.g. a request that cannot start). The engine holds none of its locks across Submit,
// and ignores a call for a request it already forced to time out.
//
// Buffer invariant: when a transport calls done (with any status) it has stopped touching the
// request's local buffer for good, and it never touches it afterwards. A deadline is reported
// as StatusCode::kDeadlineExceeded only once that holds: e.g. TCP first shuts the connection
// down and waits until its I/O threads have let go of the buffer.
using CompletionCallback = std::function<void(Status)>;

// How long past a batch deadline WaitBatch keeps waiting for transports to report before it
// forces the stragglers to kTimedOut.
inline constexpr std::chrono::milliseconds kReapSlack{200};

class Transport {
 public:
  // Ends every request not yet finished (done with kCancelled or kUnavailable) and returns once
  // no thread of the transport touches any buffer.
  virtual ~Transport() = default;
  virtual Protocol protocol() const = 0;
  virtual TransportCaps caps() const = 0;
  // Adds this transport's endpoint fields to a descriptor being published for `region`.
  virtual Status OnRegister(const LocalRegion& region, SegmentDescriptor* desc) = 0;
  virtual void OnUnregister(const LocalRegion& region) = 0;
  // Whether this transport can reach the segment (e.g. shm: same host_id and shm_fd >= 0).
  virtual bool CanReach(const SegmentDescriptor& remote) const = 0;
  virtual StatusOr<std::unique_ptr<RemoteSegment>> Open(const SegmentDescriptor& remote) = 0;
  // Starts one validated request (already checked against both the local registration and the
  // segment size). Must not block; must call done exactly once, at the latest shortly after
  // `deadline` (the engine's WaitBatch gives up waiting `kReapSlack` past it and then counts the
  // request as timed out; a transport that misses that is a bug, logged by the engine).
  virtual void Submit(RemoteSegment& segment, const TransferRequest& request,
                      Clock::time_point deadline, CompletionCallback done) = 0;
};

}  // namespace tandem::transfer
