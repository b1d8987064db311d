// TransferEngineImpl: registration and publication of local memory and segments, and the
// table of opened (remote) segment handles.
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "common/logging.h"
#include "transfer/transfer_engine_internal.h"
#include "transfer/transfer_util_internal.h"

namespace tandem::transfer::internal {
namespace {

const char kSegmentPrefix[] = "tandem/segments/";
constexpr size_t kMaxSegmentName = 200;  // bytes
constexpr auto kUnregisterWait = std::chrono::seconds(5);

bool ValidSegmentName(const std::string& name) {
  if (name.empty() || name.size() > kMaxSegmentName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c > ' ' && c < 127;  // printable ASCII, no spaces
  });
}

}  // namespace

// ---- Registration --------------------------------------------------------------------------

bool TransferEngineImpl::Overlaps(const void* p, uint64_t len) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + len;
  auto it = regions_.lower_bound(end);  // first region starting at or after our end
  if (it == regions_.begin()) return false;
  --it;
  const uintptr_t rb = it->first;
  return rb + it->second->info.size > begin;
}

std::shared_ptr<Region> TransferEngineImpl::FindLocal(const void* p, uint64_t len) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(begin);
  if (it == regions_.begin()) return nullptr;
  --it;
  const uint64_t offset = begin - it->first;
  if (offset >= it->second->info.size || len > it->second->info.size - offset) return nullptr;
  return it->second;
}

Status TransferEngineImpl::Publish(const std::string& name, std::shared_ptr<Region> region) {
  if (!ValidSegmentName(name)) {
    return InvalidArgument("bad segment name '" + name + "' (1.." +
                           std::to_string(kMaxSegmentName) + " printable characters, no spaces)");
  }
  const std::string key = kSegmentPrefix + name;
  {
    std::shared_lock<std::shared_mutex> lock(mem_mu_);
    if (segments_.count(name) != 0) {
      return FailedPrecondition("segment '" + name + "' is already published by this engine");
    }
    if (Overlaps(region->info.base, region->info.size)) {
      return InvalidArgument("segment '" + name + "' overlaps memory already registered");
    }
  }
  auto existing = options_.metadata->Get(key);
  if (existing.ok()) {
    auto desc = SegmentDescriptor::FromJson(*existing);
    return FailedPrecondition("segment '" + name + "' is already published by '" +
                              (desc.ok() ? desc->owner : std::string("?")) + "'");
  }
  if (existing.status().code() != StatusCode::kNotFound) {
    return existing.status().WithContext("metadata lookup of '" + key + "'");
  }
  region->info.segment_name = name;
  region->info.retiring = &region->retiring;
  region->metadata_key = key;
  SegmentDescriptor desc;
  desc.name = name;
  desc.owner = options_.local_name;
  desc.host_id = host_id_;
  desc.size = region->info.size;
  desc.owner_pid = static_cast<int>(::getpid());
  for (auto& t : transports_) {
    TANDEM_RETURN_IF_ERROR(t->OnRegister(region->info, &desc));
  }
  {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    if (segments_.count(name) != 0 || Overlaps(region->info.base, region->info.size)) {
      return FailedPrecondition("segment '" + name + "' registered concurrently");
    }
    segments_[name] = region;
    regions_[reinterpret_cast<uintptr_t>(region->info.base)] = region;
  }
  Status st = options_.metadata->Put(key, desc.ToJson());
  if (!st.ok()) {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    segments_.erase(name);
    regions_.erase(reinterpret_cast<uintptr_t>(region->info.base));
    return st.WithContext("publishing segment '" + name + "'");
  }
  GetLogger("transfer")
      ->debug("published segment '{}' ({} bytes, shm_fd {}, {})", name, desc.size, desc.shm_fd,
              desc.tcp_endpoint);
  return OkStatus();
}

StatusOr<void*> TransferEngineImpl::AllocateSegment(const std::string& name, uint64_t size) {
  if (size == 0) return InvalidArgument("segment '" + name + "': size must be > 0");
  if (!ValidSegmentName(name)) {
    return InvalidArgument("bad segment name '" + name + "'");
  }
  TANDEM_ASSIGN_OR_RETURN(SharedMemory shm, CreateSharedMemory(name, size));
  auto region = std::make_shared<Region>();
  region->shm = std::move(shm);
  region->info.base = region->shm.mapping.addr();
  region->info.size = size;
  region->info.memfd = region->shm.fd.get();
  void* base = region->info.base;
  TANDEM_RETURN_IF_ERROR(Publish(name, std::move(region)));
  return base;
}

Status TransferEngineImpl::RegisterSegment(const std::string& name, void* base, uint64_t size) {
  if (base == nullptr || size == 0) {
    return InvalidArgument("segment '" + name + "': null base or zero size");
  }
  auto region = std::make_shared<Region>();
  region->info.base = base;
  region->info.size = size;
  return Publish(name, std::move(region));
}

Status TransferEngineImpl::UnregisterSegment(const std::string& name) {
  std::shared_ptr<Region> region;
  {
    std::unique_lock<std::shared_mutex> lock(mem_mu_);
    auto it = segments_.find(name);
    if (it == segments_.end()) return NotFound("segment '" + name + "' is not registered here");
    region = it->second;
    segments_.erase(it);
    regions_.erase(reinterpret_cast<uintptr_t>(region->info.base));
  }
  region->retiring.store(true, std::memory_order_release);
  for (auto& t : transports_) t->OnUnregister(region->info);
  Status st = options_.metadata->Delete(region->metadata_key);
  if (!st.ok() && st.code() != StatusCode::kNotFound) {
    GetLogger("transfer")->warn("unpublishing segment '{}': {}", name, st.ToString());
  }
  // Transfers into or out of the segment hold references; wait for them (bounded).
  const auto limit = Clock::now() + kUnregisterWait;
  while (region.use_count() > 1 && Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (region.use_count() > 1) {
    return DeadlineExceeded("segment '" + name + "' unpublished but still in use by a transfer");
  }
  return OkStatus();
}

Status TransferEngineImpl::RegisterLocalMemory(void* base, uint64_t size) {
  if (base == nullptr || size == 0) return InvalidArgument("local memory: null base or zero size");
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  if (Overlaps(base, size))
    return InvalidArgument("local memory overlaps memory already registered");
  auto region = std::make_shared<Region>();
  region->info.base = base;
  region->info.size = size;
  regions_[reinterpret_cast<uintptr_t>(base)] = std::move(region);
  return OkStatus();
}

Status TransferEngineImpl::UnregisterLocalMemory(void* base) {
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end()) return NotFound("no local memory registered at this address");
  if (!it->second->info.segment_name.empty()) {
    return FailedPrecondition("memory is segment '" + it->second->info.segment_name +
                              "'; use UnregisterSegment");
  }
  regions_.erase(it);
  return OkStatus();
}

std::shared_ptr<const LocalRegion> TransferEngineImpl::FindSegment(const std::string& name) {
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = segments_.find(name);
  if (it == segments_.end()) return nullptr;
  return std::shared_ptr<const LocalRegion>(it->second, &it->second->info);
}

// ---- Opened segments ----------------------------------------------------------------------

StatusOr<SegmentHandle> TransferEngineImpl::OpenSegment(const std::string& name) {
  auto json = options_.metadata->Get(kSegmentPrefix + name);
  if (!json.ok()) {
    if (json.status().code() == StatusCode::kNotFound) {
      return NotFound("segment '" + name + "' is not published");
    }
    return json.status().WithContext("looking up segment '" + name + "'");
  }
  TANDEM_ASSIGN_OR_RETURN(SegmentDescriptor desc, SegmentDescriptor::FromJson(*json));
  auto opened = std::make_shared<OpenedSegment>();
  std::string tried;
  for (Protocol p : options_.protocols) {
    Transport* t = TransportFor(p);
    if (t == nullptr || !t->CanReach(desc)) continue;
    auto remote = t->Open(desc);
    if (!remote.ok()) {
      GetLogger("transfer")
          ->warn("segment '{}': {} failed ({}); trying the next protocol", name, ProtocolName(p),
                 remote.status().ToString());
      tried += std::string(tried.empty() ? "" : "; ") + ProtocolName(p) + ": " +
               remote.status().message();
      continue;
    }
    opened->protocol = p;
    opened->transport = t;
    opened->remote = std::move(*remote);
    break;
  }
  if (opened->remote == nullptr) {
    return Unavailable("no usable transport reaches segment '" + name + "' of '" + desc.owner +
                       "'" + (tried.empty() ? std::string() : " (" + tried + ")"));
  }
  if (opened->protocol == Protocol::kTcp) {
    MutexLock notify_lock(&opened->notify_mu);  // not shared yet: uncontended, for the analysis
    opened->notify_remote = opened->remote;
  }
  opened->desc = std::move(desc);
  std::unique_lock<std::shared_mutex> lock(open_mu_);
  const uint64_t id = next_handle_++;
  opened_[id] = std::move(opened);
  return SegmentHandle{id};
}

Status TransferEngineImpl::CloseSegment(SegmentHandle handle) {
  std::shared_ptr<OpenedSegment> victim;  // released outside the lock
  std::unique_lock<std::shared_mutex> lock(open_mu_);
  auto it = opened_.find(handle.id);
  if (it == opened_.end()) return NotFound("unknown segment handle " + std::to_string(handle.id));
  victim = std::move(it->second);
  opened_.erase(it);
  lock.unlock();
  return OkStatus();
}

StatusOr<Protocol> TransferEngineImpl::SegmentProtocol(SegmentHandle handle) const {
  std::shared_lock<std::shared_mutex> lock(open_mu_);
  auto it = opened_.find(handle.id);
  if (it == opened_.end()) return NotFound("unknown segment handle " + std::to_string(handle.id));
  return it->second->protocol;
}

}  // namespace tandem::transfer::internal
