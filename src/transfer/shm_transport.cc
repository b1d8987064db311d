#include "transfer/shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace tandem::transfer {
namespace {

// memfd names are limited to 249 bytes; the tail is enough to recognise the file.
std::string MemfdName(const std::string& segment) { return ("tandem:" + segment).substr(0, 240); }

class ShmRemoteSegment : public RemoteSegment {
 public:
  ShmRemoteSegment(SegmentDescriptor desc, Mapping mapping)
      : desc_(std::move(desc)), mapping_(std::move(mapping)) {}
  const SegmentDescriptor& descriptor() const override { return desc_; }
  char* base() const { return static_cast<char*>(mapping_.addr()); }

 private:
  const SegmentDescriptor desc_;
  Mapping mapping_;  // the owner's memfd, mapped read-write; released with the segment
};

}  // namespace

StatusOr<SharedMemory> CreateSharedMemory(const std::string& segment, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (size == 0 || size > (uint64_t{1} << 46)) {
    return InvalidArgument("segment size " + std::to_string(size) + " out of range");
  }
  const uint64_t rounded = (size + page - 1) / page * page;
  SharedMemory shm;
  shm.fd = UniqueFd(::memfd_create(MemfdName(segment).c_str(), MFD_CLOEXEC));
  if (!shm.fd.valid()) return ErrnoStatus("memfd_create", errno);
  if (::ftruncate(shm.fd.get(), static_cast<off_t>(rounded)) != 0) {
    return ErrnoStatus("ftruncate memfd to " + std::to_string(rounded) + " bytes", errno);
  }
  void* addr = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, shm.fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap memfd", errno);
  shm.mapping = Mapping(addr, rounded);
  return shm;
}

ShmTransport::ShmTransport(TransportHost* host, std::string host_id)
    : host_(host),
      host_id_(std::move(host_id)),
      stopping_(std::make_shared<std::atomic<bool>>(false)) {}

ShmTransport::~ShmTransport() { stopping_->store(true, std::memory_order_release); }

TransportCaps ShmTransport::caps() const {
  TransportCaps c;
  c.same_host_only = true;
  c.zero_copy = true;  // one memcpy, no staging
  c.needs_shared_memory = true;
  c.slice_bytes = 1 << 20;
  return c;
}

Status ShmTransport::OnRegister(const LocalRegion& region, SegmentDescriptor* desc) {
  desc->shm_fd = region.memfd;  // -1 for caller-owned memory: not reachable over shm
  return OkStatus();
}

bool ShmTransport::CanReach(const SegmentDescriptor& remote) const {
  return remote.shm_fd >= 0 && remote.owner_pid > 0 && !remote.host_id.empty() &&
         remote.host_id == host_id_;
}

StatusOr<std::unique_ptr<RemoteSegment>> ShmTransport::Open(const SegmentDescriptor& remote) {
  if (!CanReach(remote)) {
    return FailedPrecondition("segment '" + remote.name + "' is not shared memory on this host");
  }
  const std::string path =
      "/proc/" + std::to_string(remote.owner_pid) + "/fd/" + std::to_string(remote.shm_fd);
  // A stale descriptor (owner gone, pid reused) must not make us map some unrelated file.
  char link[512];
  const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  if (n < 0) return ErrnoStatus("segment '" + remote.name + "': readlink " + path, errno);
  link[n] = '\0';
  const std::string expected = "/memfd:" + MemfdName(remote.name);
  if (std::strncmp(link, expected.c_str(), expected.size()) != 0) {
    return FailedPrecondition("segment '" + remote.name + "': " + path + " is '" + link +
                              "', not the segment's memfd (stale descriptor?)");
  }
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("segment '" + remote.name + "': open " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat " + path, errno);
  if (static_cast<uint64_t>(st.st_size) < remote.size) {
    return FailedPrecondition("segment '" + remote.name + "': memfd has " +
                              std::to_string(st.st_size) + " bytes, descriptor says " +
                              std::to_string(remote.size));
  }
  void* addr = ::mmap(nullptr, remote.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus("segment '" + remote.name + "': mmap", errno);
  // The mapping keeps the memfd alive; the descriptor itself is closed here.
  return std::unique_ptr<RemoteSegment>(
      std::make_unique<ShmRemoteSegment>(remote, Mapping(addr, remote.size)));
}

namespace {

// Drops this process's page-table entries for the whole pages of [p, p + length) in a peer's
// mapped segment. The bytes stay in the peer's memfd (MADV_DONTNEED on a shared mapping only
// unmaps), but they no longer count in this process's resident set: a prefill worker that
// wrote 1 GB into a decode worker's KV would otherwise carry that gigabyte in its own RSS
// too, past its memory plan (engine/memory_plan.h). The next copy into those pages takes a
// minor fault per page.
void ForgetPages(char* p, uint64_t length) {
  static const uintptr_t kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + length) & ~(kPage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

void ShmTransport::Submit(RemoteSegment& segment, const TransferRequest& request,
                          Clock::time_point deadline, CompletionCallback done) {
  // The engine keeps `segment` (and so the mapping) alive until done has been called.
  char* remote = static_cast<ShmRemoteSegment&>(segment).base() + request.remote_offset;
  char* local = static_cast<char*>(request.local);
  const uint64_t length = request.length;
  const bool write = request.op == OpCode::kWrite;
  host_->RunOnWorker(
      [stopping = stopping_, remote, local, length, write, deadline, done = std::move(done)] {
        if (stopping->load(std::memory_order_acquire)) {
          done(Cancelled("transfer engine shutting down"));
          return;
        }
        if (Clock::now() > deadline) {
          done(DeadlineExceeded("shm copy not started before the deadline"));
          return;
        }
        if (write) {
          std::memcpy(remote, local, length);
        } else {
          std::memcpy(local, remote, length);
        }
        ForgetPages(remote, length);
        done(OkStatus());
      });
}

}  // namespace tandem::transfer
