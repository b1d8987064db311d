// Shared-memory transport: same-host segments allocated with AllocateSegment (memfd). The
// initiator maps the owner's memfd through /proc/<owner_pid>/fd/<shm_fd> once per opened segment
// and moves data with one memcpy per slice, on the engine's worker threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "transfer/transfer_util_internal.h"
#include "transfer/transport.h"

namespace tandem::transfer {

// Memory backing a segment made by AllocateSegment: a memfd and its MAP_SHARED mapping.
struct SharedMemory {
  UniqueFd fd;      // memfd (close-on-exec); its number is published as shm_fd
  Mapping mapping;  // whole memfd, read-write, page-aligned, zero-filled
};

// Creates a memfd named "tandem:<segment>" of `size` bytes (rounded up to pages) and maps it.
StatusOr<SharedMemory> CreateSharedMemory(const std::string& segment, uint64_t size);

class ShmTransport : public Transport {
 public:
  // host outlives the transport; host_id is this host's boot id.
  ShmTransport(TransportHost* host, std::string host_id);
  // Copies still queued on the workers end with kCancelled when they run.
  ~ShmTransport() override;

  Protocol protocol() const override { return Protocol::kShm; }
  TransportCaps caps() const override;
  Status OnRegister(const LocalRegion& region, SegmentDescriptor* desc) override;
  void OnUnregister(const LocalRegion& region) override {}
  bool CanReach(const SegmentDescriptor& remote) const override;
  StatusOr<std::unique_ptr<RemoteSegment>> Open(const SegmentDescriptor& remote) override;
  void Submit(RemoteSegment& segment, const TransferRequest& request, Clock::time_point deadline,
              CompletionCallback done) override;

 private:
  TransportHost* const host_;
  const std::string host_id_;
  // Shared with queued copies, which may run after the transport is gone.
  std::shared_ptr<std::atomic<bool>> stopping_;
};

}  // namespace tandem::transfer
