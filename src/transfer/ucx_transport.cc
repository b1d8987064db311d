// The UCX transport: the "ucx1:" segment address format, UcxRemoteSegment, the UcxTransport
// class (registration, Open, Submit) and MakeUcxTransport. The progress thread behind it is
// UcxWorker (ucx_transport_internal.h).
#include "transfer/ucx_transport.h"

#include <cstdio>
#include <string_view>

#include "common/logging.h"
#include "transfer/ucx_transport_internal.h"

namespace tandem::transfer {
namespace internal {
namespace {

constexpr const char* kAddressPrefix = "ucx1:";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

StatusOr<std::string> FromHex(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0) return InvalidArgument("bad hex field in ucx address");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("bad hex digit in ucx address");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

StatusOr<UcxAddress> ParseUcxAddress(const std::string& s) {
  const std::string_view prefix = kAddressPrefix;
  if (s.compare(0, prefix.size(), prefix) != 0) {
    return InvalidArgument("ucx address does not start with 'ucx1:'");
  }
  std::string_view rest = std::string_view(s).substr(prefix.size());
  const size_t a = rest.find(':');
  const size_t b = a == std::string_view::npos ? a : rest.find(':', a + 1);
  if (b == std::string_view::npos) return InvalidArgument("ucx address needs worker:base:rkey");
  UcxAddress out;
  TANDEM_ASSIGN_OR_RETURN(out.worker, FromHex(rest.substr(0, a)));
  const std::string_view base = rest.substr(a + 1, b - a - 1);
  if (base.empty() || base.size() > 16) return InvalidArgument("bad base address in ucx address");
  for (char c : base) {
    const int d = HexDigit(c);
    if (d < 0) return InvalidArgument("bad base address in ucx address");
    out.base = out.base * 16 + static_cast<uint64_t>(d);
  }
  TANDEM_ASSIGN_OR_RETURN(out.rkey, FromHex(rest.substr(b + 1)));
  return out;
}

class UcxRemoteSegment : public RemoteSegment {
 public:
  UcxRemoteSegment(SegmentDescriptor desc, std::shared_ptr<UcxWorker> worker, uint64_t peer_id,
                   uint64_t rkey_id, uint64_t base)
      : desc_(std::move(desc)),
        worker_(std::move(worker)),
        peer_id_(peer_id),
        rkey_id_(rkey_id),
        base_(base) {}
  ~UcxRemoteSegment() override {
    worker_->Post([w = worker_.get(), p = peer_id_, r = rkey_id_] { w->ReleaseRkey(p, r); });
  }
  const SegmentDescriptor& descriptor() const override { return desc_; }
  uint64_t peer_id() const { return peer_id_; }
  uint64_t rkey_id() const { return rkey_id_; }
  uint64_t base() const { return base_; }

 private:
  SegmentDescriptor desc_;
  std::shared_ptr<UcxWorker> worker_;
  uint64_t peer_id_, rkey_id_;
  uint64_t base_;  // the segment's address in its owner
};

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxWorker> worker) : worker_(std::move(worker)) {}
  ~UcxTransport() override { worker_->Stop(); }

  Protocol protocol() const override { return Protocol::kUcx; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.zero_copy = true;
    c.slice_bytes = uint64_t{64} << 20;  // UCX pipelines large messages itself
    return c;
  }

  Status OnRegister(const LocalRegion& region, SegmentDescriptor* desc) override {
    if (region.base == nullptr || region.size == 0) {
      return InvalidArgument("ucx: cannot register an empty region");
    }
    const bool publish = !region.segment_name.empty() && desc != nullptr;
    UcxWorker* w = worker_.get();
    void* base = region.base;
    const uint64_t size = region.size;
    TANDEM_ASSIGN_OR_RETURN(std::string rkey, worker_->Call<std::string>([w, base, size, publish] {
      return w->MapRegion(base, size, publish);
    }));
    if (publish) {
      char base_hex[32];
      std::snprintf(base_hex, sizeof(base_hex), "%llx",
                    static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(base)));
      desc->ucx_address =
          std::string(kAddressPrefix) + worker_->worker_hex() + ":" + base_hex + ":" + rkey;
    }
    return OkStatus();
  }

  void OnUnregister(const LocalRegion& region) override {
    UcxWorker* w = worker_.get();
    void* base = region.base;
    auto done = worker_->Call<bool>([w, base]() -> StatusOr<bool> {
      w->UnmapRegion(base);
      return true;
    });
    if (!done.ok()) {
      GetLogger("transfer")->warn("ucx: unregister: {}", done.status().ToString());
    }
  }

  bool CanReach(const SegmentDescriptor& remote) const override {
    return !remote.ucx_address.empty() && ParseUcxAddress(remote.ucx_address).ok();
  }

  StatusOr<std::unique_ptr<RemoteSegment>> Open(const SegmentDescriptor& remote) override {
    if (remote.ucx_address.empty()) {
      return InvalidArgument("segment '" + remote.name + "' publishes no ucx address");
    }
    auto parsed = ParseUcxAddress(remote.ucx_address);
    if (!parsed.ok()) return parsed.status().WithContext("segment '" + remote.name + "'");
    UcxWorker* w = worker_.get();
    auto addr = std::make_shared<UcxAddress>(std::move(*parsed));
    TANDEM_ASSIGN_OR_RETURN(
        auto ids,
        (worker_->Call<std::pair<uint64_t, uint64_t>>([w, addr] { return w->Connect(*addr); })));
    return std::unique_ptr<RemoteSegment>(
        new UcxRemoteSegment(remote, worker_, ids.first, ids.second, addr->base));
  }

  void Submit(RemoteSegment& segment, const TransferRequest& request, Clock::time_point deadline,
              CompletionCallback done) override {
    auto* seg = dynamic_cast<UcxRemoteSegment*>(&segment);
    if (seg == nullptr) {
      done(InvalidArgument("segment was not opened by the ucx transport"));
      return;
    }
    const uint64_t size = seg->descriptor().size;
    if (request.length == 0 || request.local == nullptr || request.remote_offset > size ||
        request.length > size - request.remote_offset) {
      done(OutOfRange("ucx request outside the segment or empty"));
      return;
    }
    UcxWorker* w = worker_.get();
    const bool write = request.op == OpCode::kWrite;
    const uint64_t peer = seg->peer_id(), rkey = seg->rkey_id();
    const uint64_t remote = seg->base() + request.remote_offset;
    void* local = request.local;
    const uint64_t length = request.length;
    // The callback is copied into the task only if the task is queued; a refused Post leaves
    // `done` with us to report the failure.
    auto shared_done = std::make_shared<CompletionCallback>(std::move(done));
    const bool queued =
        worker_->Post([w, write, peer, rkey, remote, local, length, deadline, shared_done] {
          w->StartOp(write, peer, rkey, remote, local, length, deadline, std::move(*shared_done));
        });
    if (!queued) (*shared_done)(Cancelled("ucx transport is stopped"));
  }

 private:
  std::shared_ptr<UcxWorker> worker_;
};

}  // namespace
}  // namespace internal

StatusOr<std::unique_ptr<Transport>> MakeUcxTransport(TransportHost* host,
                                                      const UcxTransportOptions& options) {
  if (options.progress_spin_us < 0 || options.open_timeout_ms <= 0) {
    return InvalidArgument("ucx: progress_spin_us must be >= 0 and open_timeout_ms > 0");
  }
  std::string name = host != nullptr ? host->local_name() : std::string("ucx");
  auto worker = std::make_shared<internal::UcxWorker>(options, std::move(name));
  Status st = worker->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<Transport>(new internal::UcxTransport(std::move(worker)));
}

}  // namespace tandem::transfer
