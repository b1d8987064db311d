// The transfer engine: moves bytes (KV cache blocks) between registered memory segments of
// processes on one host (shared memory) or across hosts (TCP; UCX where built). It knows nothing
// about models; the engine's KV pool is just one registered segment.
//
//   auto meta = OpenMetadataStore("etcd://127.0.0.1:2379");        // or "embedded:", "http://..."
//   TransferEngineOptions o; o.local_name = "decode-0"; o.metadata = *meta;
//   auto te = TransferEngine::Create(o);
//   // target: allocate (or register) memory and publish it under a segment name
//   auto seg = (*te)->AllocateSegment("decode-0/kv", 64 << 20);     // memfd-backed, shm-capable
//   // initiator:
//   auto h = (*te)->OpenSegment("decode-0/kv");
//   TransferRequest r{OpCode::kWrite, local_ptr, *h, /*remote_offset=*/0, /*length=*/4096};
//   auto batch = (*te)->SubmitBatch({&r, 1}, Clock::now() + 1s, "kv-done:req-7");
//   BatchStatus s = (*te)->WaitBatch(*batch);                       // returns by the deadline
//   (*te)->FreeBatch(*batch);
//
// Thread-safety: thread-safe. Every method may be called from any thread, concurrently with the
// others (only the destructor must not race with any call). Data moves on the engine's own
// threads (the worker pool and the transports' threads; a reaper thread enforces deadlines).
// The notification handler runs on a TCP listener thread, one per sending connection (so calls
// for different senders may overlap), with no engine lock held: it may call the engine, but not
// destroy it.
//
// Invariants:
// - Every request ends in exactly one terminal state (completed, failed with a reason, timed
//   out); WaitBatch never waits past the batch deadline (plus a small reaping slack).
// - Bad requests (zero length, local range not inside registered memory, remote range outside
//   the segment, unknown segment handle) are refused by SubmitBatch before anything moves.
// - A notification, if given, is delivered to the owner of the batch's target segment after
//   every request of the batch completed; never if one failed or timed out. It travels over TCP
//   (to the owner's data listener) whatever transport moved the data. The batch becomes terminal
//   only once the owner's handler returned (or the notification failed: then the batch is
//   kFailed / kTimedOut with first_error naming the notification, while every request shows
//   kCompleted).
// - When a transport reports a request terminal it no longer touches the request's local
//   buffer (TCP closes the connection of a request that timed out mid-flight before reporting).
//   The remote range of a write that failed or timed out holds unspecified data, and may still
//   change for a moment (bytes already in flight can land after the report).
// - Segments published by a process carry a lease: when the process dies its descriptors vanish
//   from the metadata service after the TTL.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "transfer/metadata.h"

namespace tandem::transfer {

using Clock = std::chrono::steady_clock;

enum class Protocol { kShm, kTcp, kUcx };
const char* ProtocolName(Protocol p);  // "shm", "tcp", "ucx"
StatusOr<Protocol> ParseProtocol(const std::string& s);

// What a segment publishes; serialized as JSON in the metadata service under
// "tandem/segments/<name>".
struct SegmentDescriptor {
  std::string name;     // cluster-unique, e.g. "decode-0/kv"
  std::string owner;    // engine local_name of the owning process
  std::string host_id;  // identifies the host (boot id); shm only between equal host_ids
  uint64_t size = 0;    // bytes
  int owner_pid = 0;
  int shm_fd = -1;           // memfd in the owner; peers map /proc/<owner_pid>/fd/<shm_fd>
  std::string tcp_endpoint;  // "host:port" of the owner's data listener; always present
  std::string ucx_address;   // hex UCX worker address + packed rkey; empty without UCX

  std::string ToJson() const;
  static StatusOr<SegmentDescriptor> FromJson(const std::string& json);
};

// An opened remote segment. Cheap to copy; valid until CloseSegment.
struct SegmentHandle {
  uint64_t id = 0;
};

enum class OpCode { kRead, kWrite };  // read: remote -> local; write: local -> remote

struct TransferRequest {
  OpCode op = OpCode::kWrite;
  void* local = nullptr;       // inside memory registered with this engine
  SegmentHandle segment;       // opened remote segment (may be one of our own: loopback)
  uint64_t remote_offset = 0;  // bytes from the segment base
  uint64_t length = 0;         // bytes, > 0
};

enum class TransferState { kPending, kCompleted, kFailed, kTimedOut };
const char* TransferStateName(TransferState s);

struct RequestStatus {
  TransferState state = TransferState::kPending;
  Status error;  // set for kFailed / kTimedOut
};

struct BatchStatus {
  // kCompleted only if every request completed (and the notification, if any, was delivered);
  // kFailed if any request failed (or the notification could not be delivered); else kTimedOut.
  TransferState state = TransferState::kPending;
  int completed = 0, failed = 0, timed_out = 0, pending = 0;
  Status first_error;
};

using BatchId = uint64_t;

// A small message from a peer, delivered after its batch into one of our segments completed.
struct Notification {
  std::string from;     // the sender's local_name
  std::string segment;  // which of our segments the batch wrote into / read from
  std::string message;
};

struct TransferCounters {
  uint64_t bytes_written = 0, bytes_read = 0;  // completed requests, as initiator
  uint64_t requests_completed = 0, requests_failed = 0, requests_timed_out = 0;
  uint64_t requests_refused = 0;  // every request of each refused batch
                                  // (an empty batch counts one)
  uint64_t bytes_served = 0;      // as target over TCP/UCX
  uint64_t notifications_sent = 0, notifications_received = 0;
};

struct TransferEngineOptions {
  std::string local_name;                     // unique in the cluster
  std::shared_ptr<MetadataStore> metadata;    // required
  std::string tcp_listen_host = "127.0.0.1";  // the data listener (also carries notifications)
  int tcp_listen_port = 0;                    // 0: ephemeral
  std::string tcp_advertise_host;             // empty: tcp_listen_host
  int tcp_connections_per_peer = 4;
  int worker_threads = 2;  // submit/copy threads
  // Transports this engine may use as initiator, in order of preference when a peer is
  // reachable by several. Shm is used only for segments on the same host.
  std::vector<Protocol> protocols = {Protocol::kShm, Protocol::kTcp};
};

class TransferEngine {
 public:
  static StatusOr<std::unique_ptr<TransferEngine>> Create(TransferEngineOptions options);
  // Stops the listener, fails every pending request, unpublishes segments, releases mappings.
  virtual ~TransferEngine() = default;

  // Allocates `size` bytes of shared memory (memfd, page-aligned, zeroed), registers it as local
  // memory and publishes it as segment `name`. The memory lives until UnregisterSegment or the
  // engine's destruction. Same-host peers reach it with one memcpy.
  virtual StatusOr<void*> AllocateSegment(const std::string& name, uint64_t size) = 0;
  // Registers caller-owned memory and publishes it (reachable over TCP/UCX, not shm).
  virtual Status RegisterSegment(const std::string& name, void* base, uint64_t size) = 0;
  // Unpublishes the segment and waits (up to 5 s) until no transfer uses its memory any more;
  // DeadlineExceeded if one still does (memfd memory then stays mapped until it ends).
  virtual Status UnregisterSegment(const std::string& name) = 0;
  // Registers memory as a valid local source/destination without publishing it.
  virtual Status RegisterLocalMemory(void* base, uint64_t size) = 0;
  virtual Status UnregisterLocalMemory(void* base) = 0;

  // Looks the segment up in the metadata service and picks a transport. NotFound if unknown.
  virtual StatusOr<SegmentHandle> OpenSegment(const std::string& name) = 0;
  virtual Status CloseSegment(SegmentHandle handle) = 0;
  // Which transport an opened segment uses.
  virtual StatusOr<Protocol> SegmentProtocol(SegmentHandle handle) const = 0;

  // Starts every request of the batch. All requests must target the same segment when a
  // notification is given (at most 64 KiB). Refuses the whole batch (nothing starts) if any
  // request is invalid. Never blocks on the network. A deadline already past is accepted: the
  // requests then end kTimedOut. Requests longer than 1 MiB move as several slices (spread over
  // the worker threads for shm, over the peer's connections for TCP).
  virtual StatusOr<BatchId> SubmitBatch(std::span<const TransferRequest> requests,
                                        Clock::time_point deadline,
                                        std::string notification = {}) = 0;
  virtual RequestStatus GetRequestStatus(BatchId batch, size_t index) const = 0;
  virtual BatchStatus GetBatchStatus(BatchId batch) const = 0;
  // Blocks until the batch is terminal (completed, or any failure once nothing is pending);
  // returns at the latest shortly (kReapSlack, 200 ms) after the batch deadline.
  virtual BatchStatus WaitBatch(BatchId batch) = 0;
  // Forgets a terminal batch. FailedPrecondition while requests are pending.
  virtual Status FreeBatch(BatchId batch) = 0;

  // Called on an engine thread (the TCP listener's thread of the sender's connection) for each
  // notification received, after the batch's data landed; the sender's batch completes when it
  // returns, so keep it short. Set before peers send (without one, notifications are dropped).
  virtual void SetNotificationHandler(std::function<void(const Notification&)> handler) = 0;

  virtual TransferCounters Counters() const = 0;
  virtual const std::string& local_name() const = 0;
};

}  // namespace tandem::transfer
