// PoolClient: master calls over HTTP, data over the transfer engine, a heartbeat for mounts.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/http.h"
#include "common/http_status.h"
#include "common/json_numbers.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "store/checksum_internal.h"
#include "store/master_channel_internal.h"
#include "store/pool.h"
#include "store/pool_protocol_internal.h"
#include "store/ssd_tier.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace tandem::store {

namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

class PoolClientImpl final : public PoolClient {
 public:
  explicit PoolClientImpl(PoolClientOptions o)
      : options_(std::move(o)),
        log_(GetLogger("pool")),
        channel_(options_.master_uri, options_.metadata, options_.rpc_timeout,
                 options_.master_retry) {}

  ~PoolClientImpl() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    if (heartbeat_.joinable()) heartbeat_.join();
    const Clock::time_point deadline = Clock::now() + milliseconds(500);
    std::vector<std::string> mounted;
    {
      MutexLock lock(&mu_);
      for (const auto& [name, bytes] : mounts_) mounted.push_back(name);
    }
    for (const std::string& name : mounted) {
      (void)channel_.Call("/pool/unmount", {{"segment", name}},
                          deadline);  // best effort: leases end it
      (void)options_.engine->UnregisterSegment(name);
    }
    MutexLock lock(&mu_);
    for (const auto& [name, handle] : handles_) (void)options_.engine->CloseSegment(handle);
  }

  Status MountDram(const std::string& segment, uint64_t bytes) override {
    TANDEM_RETURN_IF_ERROR(options_.engine->AllocateSegment(segment, bytes).status());
    {
      MutexLock lock(&mu_);
      mounts_[segment] = bytes;
      stats_.dram_bytes += bytes;
      if (!heartbeat_.joinable()) heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    }
    if (Status st = MountOne(segment, bytes, Clock::now() + options_.rpc_timeout); !st.ok()) {
      log_->warn("pool segment {} not mounted yet (retrying): {}", segment, st.ToString());
    }
    return OkStatus();
  }

  StatusOr<int> GetPrefix(const std::vector<std::string>& keys, const std::vector<void*>& dests,
                          uint64_t size, Clock::time_point deadline) override {
    if (dests.size() != keys.size()) return InvalidArgument("keys and dests differ in length");
    StatusOr<Prefix> prefix = Lookup(keys, deadline);
    if (!prefix.ok() && !ssd_) return prefix.status();
    size_t n = 0;
    if (prefix.ok()) {
      n = static_cast<size_t>(
          Read(*prefix, std::vector<void*>(dests.begin(), dests.begin() + prefix->keys.size()),
               size, deadline));
    }
    if (!ssd_) return static_cast<int>(n);
    // The SSD tier continues the prefix where the DRAM pool's ended.
    const size_t from_dram = n;
    while (n < keys.size() && ssd_->Read(keys[n], dests[n], size)) ++n;
    if (n > from_dram) {
      Count([&](PoolClientStats& s) {
        s.ssd_hit_objects += n - from_dram;
        s.hit_objects += n - from_dram;
        s.bytes_fetched += (n - from_dram) * size;
      });
      if (prefix.ok()) {  // promoted: other nodes find them in DRAM again
        (void)Put(std::vector<std::string>(keys.begin() + from_dram, keys.begin() + n),
                  std::vector<void*>(dests.begin() + from_dram, dests.begin() + n), size, deadline);
      }
    }
    if (n == 0 && !prefix.ok()) return prefix.status();
    return static_cast<int>(n);
  }

  StatusOr<int> Put(const std::vector<std::string>& keys, const std::vector<void*>& srcs,
                    uint64_t size, Clock::time_point deadline) override {
    if (srcs.size() != keys.size()) return InvalidArgument("keys and srcs differ in length");
    if (keys.empty()) return 0;
    if (ssd_) {  // write-through (asynchronous; stored ones are skipped)
      for (size_t i = 0; i < keys.size(); ++i) (void)ssd_->Offer(keys[i], srcs[i], size);
    }
    const auto ttl = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    TANDEM_ASSIGN_OR_RETURN(json reply,
                            channel_.Call("/pool/put_start",
                                          {{"keys", keys},
                                           {"size", size},
                                           {"replicas", options_.replicas},
                                           {"node", options_.node},
                                           {"ttl_ms", std::max<int64_t>(1, ttl.count())}},
                                          deadline));
    std::vector<std::vector<Location>> targets(keys.size());
    uint64_t existing = 0, no_space = 0;
    try {
      const auto& results = reply.at("results");
      if (results.size() != keys.size()) return Internal("pool master answered for other keys");
      for (size_t i = 0; i < keys.size(); ++i) {
        const std::string decision = results[i].at("decision").get<std::string>();
        if (decision == "reserved") {
          targets[i] = internal::LocationsFromJson(results[i].at("locations"));
        } else if (decision == "exists") {
          ++existing;
        } else {
          ++no_space;
        }
      }
    } catch (const json::exception& e) {
      return Internal(std::string("pool master reply: ") + e.what());
    }
    // Write every replica; an object is committed only if all its replicas landed.
    std::vector<std::string> written_keys;
    std::vector<bool> ok;
    std::map<std::string, std::vector<std::pair<size_t, Location>>> by_segment;
    for (size_t i = 0; i < keys.size(); ++i) {
      for (const Location& l : targets[i]) by_segment[l.segment].push_back({i, l});
    }
    std::vector<bool> landed(keys.size(), true);
    for (const auto& [segment, items] : by_segment) {
      auto handle = Open(segment);
      std::vector<transfer::TransferRequest> reqs;
      for (const auto& [i, l] : items) {
        if (!handle.ok()) {
          landed[i] = false;
          continue;
        }
        reqs.push_back({transfer::OpCode::kWrite, srcs[i], *handle, l.offset, size});
      }
      if (!handle.ok() || reqs.empty()) continue;
      const std::vector<bool> results = RunBatch(reqs, deadline);
      for (size_t r = 0; r < items.size(); ++r) {
        if (!results[r]) landed[items[r].first] = false;
      }
    }
    uint64_t stored = 0, failed = 0;
    std::vector<uint64_t> checksums;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (targets[i].empty()) continue;
      written_keys.push_back(keys[i]);
      ok.push_back(landed[i]);
      checksums.push_back(landed[i] ? internal::ObjectChecksum(srcs[i], size) : 0);
      landed[i] ? ++stored : ++failed;
    }
    if (!written_keys.empty()) {
      // If this call fails the reservations lapse at their deadline: nothing half-written shows.
      (void)channel_.Call("/pool/put_end",
                          {{"keys", written_keys}, {"ok", ok}, {"checksums", checksums}}, deadline);
    }
    Count([&](PoolClientStats& s) {
      s.put_objects += stored;
      s.put_existing += existing;
      s.put_no_space += no_space;
      s.put_failures += failed;
      s.bytes_put += stored * size;
    });
    return static_cast<int>(stored);
  }

  StatusOr<std::vector<bool>> Exist(const std::vector<std::string>& keys,
                                    Clock::time_point deadline) override {
    StatusOr<std::vector<bool>> held = MasterExist(keys, deadline);
    if (!ssd_) return held;
    // This node's SSD tier answers too (GetPrefix reads it where the DRAM pool's prefix ends),
    // also while no master does.
    std::vector<bool> out = held.ok() && held->size() == keys.size()
                                ? *std::move(held)
                                : std::vector<bool>(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) out[i] = out[i] || ssd_->Holds(keys[i]);
    return out;
  }

  StatusOr<std::vector<bool>> MasterExist(const std::vector<std::string>& keys,
                                          Clock::time_point deadline) {
    TANDEM_ASSIGN_OR_RETURN(json reply, channel_.Call("/pool/exist", {{"keys", keys}}, deadline));
    try {
      return reply.at("exist").get<std::vector<bool>>();
    } catch (const json::exception& e) {
      return Internal(std::string("pool master reply: ") + e.what());
    }
  }

  Status Remove(const std::vector<std::string>& keys, Clock::time_point deadline) override {
    return channel_.Call("/pool/remove", {{"keys", keys}}, deadline).status();
  }

  PoolClientStats Stats() const override {
    PoolClientStats s;
    {
      MutexLock lock(&mu_);
      s = stats_;
    }
    s.master_unavailable = channel_.unavailable();
    if (ssd_) {
      const SsdTierStats t = ssd_->Stats();
      s.ssd_capacity_bytes = t.capacity_bytes;
      s.ssd_used_bytes = t.used_bytes;
      s.ssd_written_objects = t.written;
      s.ssd_dropped_objects = t.dropped;
      s.ssd_corrupt_objects = t.corrupt;
      s.ssd_evictions = t.evictions;
    }
    return s;
  }

  void SetSsdTier(std::unique_ptr<SsdTier> ssd) { ssd_ = std::move(ssd); }

 private:
  // The longest held prefix of some keys, leased to this reader.
  struct Prefix {
    std::vector<std::string> keys;     // the prefix's keys
    std::vector<FoundObject> objects;  // per key: its checksum, where it is, a copy to make
  };

  // GetPrefix's halves: the master's answer (one call), then the reads of its first
  // dests.size() objects; returns how many leading ones were read.
  StatusOr<Prefix> Lookup(const std::vector<std::string>& keys, Clock::time_point deadline) {
    Prefix prefix;
    if (keys.empty()) return prefix;
    Count([](PoolClientStats& s) { ++s.get_calls; });
    // The lease outlives the caller's deadline a little: reads may run until then.
    const auto lease =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now()) + milliseconds(1000);
    TANDEM_ASSIGN_OR_RETURN(
        json reply,
        channel_.Call("/pool/get",
                      {{"keys", keys}, {"lease_ms", std::clamp<int64_t>(lease.count(), 0, 600000)}},
                      deadline));
    try {
      for (const auto& o : reply.at("objects"))
        prefix.objects.push_back(internal::FoundFromJson(o));
    } catch (const json::exception& e) {
      return Internal(std::string("pool master reply: ") + e.what());
    }
    if (prefix.objects.size() > keys.size()) return Internal("pool master answered for other keys");
    prefix.keys.assign(keys.begin(), keys.begin() + prefix.objects.size());
    if (prefix.keys.empty()) Count([](PoolClientStats& s) { ++s.miss_calls; });
    return prefix;
  }

  int Read(const Prefix& prefix, const std::vector<void*>& dests, uint64_t size,
           Clock::time_point deadline) {
    const size_t count = std::min(dests.size(), prefix.keys.size());
    if (count == 0) return 0;
    const std::vector<FoundObject>& objects = prefix.objects;
    const Clock::time_point start = Clock::now();
    uint64_t corrupt = 0;
    // Every object from its first replica; an object whose read fails tries its next replica;
    // the prefix ends at the first object no replica of which could be read.
    std::vector<size_t> replica(count, 0);
    std::vector<bool> done(count, false);
    for (;;) {
      std::vector<size_t> todo;
      for (size_t i = 0; i < count; ++i) {
        if (!done[i] && replica[i] < objects[i].replicas.size()) todo.push_back(i);
      }
      if (todo.empty()) break;
      const std::vector<bool> ok = ReadObjects(objects, replica, todo, dests, size, deadline);
      for (size_t t = 0; t < todo.size(); ++t) {
        const size_t i = todo[t];
        // Read, and the bytes are the ones committed (not a stale record's, not a restarted
        // owner's fresh memory).
        const bool intact =
            ok[t] && (!prefix.objects[i].verify ||
                      internal::ObjectChecksum(dests[i], size) == prefix.objects[i].checksum);
        if (ok[t] && !intact) ++corrupt;
        if (intact) {
          done[i] = true;
        } else {
          (void)channel_.Call(
              "/pool/bad_replica",
              {{"key", prefix.keys[i]}, {"segment", objects[i].replicas[replica[i]].segment}},
              deadline);
          ++replica[i];
        }
      }
      if (Clock::now() >= deadline) break;
    }
    size_t n = 0;
    while (n < count && done[n]) ++n;
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const uint64_t copies = CopyHotObjects(prefix, dests, n, size, deadline);
    Count([&](PoolClientStats& s) {
      s.hit_objects += n;
      s.bytes_fetched += n * size;
      s.fetch_seconds += seconds;
      s.fetch_failures += count - n;
      s.checksum_failures += corrupt;
      s.hot_copies += copies;
    });
    return static_cast<int>(n);
  }

  // Hot-prefix replication: the master asked for copies of some of the first n objects (just
  // read into dests); writes them and reports each. Returns how many copies landed.
  uint64_t CopyHotObjects(const Prefix& prefix, const std::vector<void*>& dests, size_t n,
                          uint64_t size, Clock::time_point deadline) {
    std::map<std::string, std::vector<size_t>> by_segment;
    for (size_t i = 0; i < n; ++i) {
      const Location& to = prefix.objects[i].replicate_to;
      if (to.size == size) by_segment[to.segment].push_back(i);
    }
    uint64_t landed = 0;
    for (const auto& [segment, items] : by_segment) {
      std::vector<bool> ok(items.size(), false);
      if (auto handle = Open(segment); handle.ok()) {
        std::vector<transfer::TransferRequest> reqs;
        for (size_t i : items) {
          reqs.push_back({transfer::OpCode::kWrite, dests[i], *handle,
                          prefix.objects[i].replicate_to.offset, size});
        }
        ok = RunBatch(reqs, deadline);
      }
      for (size_t r = 0; r < items.size(); ++r) {
        (void)channel_.Call(
            "/pool/replica_end",
            {{"key", prefix.keys[items[r]]}, {"segment", segment}, {"ok", bool(ok[r])}}, deadline);
        landed += ok[r] ? 1 : 0;
      }
    }
    return landed;
  }

  template <typename F>
  void Count(F f) {
    MutexLock lock(&mu_);
    f(stats_);
  }

  Status MountOne(const std::string& segment, uint64_t bytes, Clock::time_point deadline) {
    return channel_
        .Call("/pool/mount",
              {{"segment", segment},
               {"node", options_.node},
               {"capacity", bytes},
               {"ttl_ms", options_.segment_ttl.count()}},
              deadline)
        .status();
  }

  void HeartbeatLoop() {
    for (;;) {
      std::map<std::string, uint64_t> mounts;
      {
        MutexLock lock(&mu_);
        cv_.WaitUntil(&mu_, Clock::now() + options_.segment_ttl / 3, [&] {
          mu_.AssertHeld();
          return stop_;
        });
        if (stop_) return;
        mounts = mounts_;
      }
      for (const auto& [name, bytes] : mounts) {
        (void)MountOne(name, bytes, Clock::now() + options_.rpc_timeout);  // retried next beat
      }
    }
  }

  StatusOr<transfer::SegmentHandle> Open(const std::string& segment) {
    {
      MutexLock lock(&mu_);
      auto it = handles_.find(segment);
      if (it != handles_.end()) return it->second;
    }
    TANDEM_ASSIGN_OR_RETURN(transfer::SegmentHandle h, options_.engine->OpenSegment(segment));
    MutexLock lock(&mu_);
    auto [it, inserted] = handles_.emplace(segment, h);
    if (!inserted) (void)options_.engine->CloseSegment(h);  // another thread opened it first
    return it->second;
  }

  void Forget(const std::string& segment) {
    MutexLock lock(&mu_);
    auto it = handles_.find(segment);
    if (it == handles_.end()) return;
    (void)options_.engine->CloseSegment(it->second);
    handles_.erase(it);
  }

  // Runs one batch; per request whether it completed by the deadline.
  std::vector<bool> RunBatch(const std::vector<transfer::TransferRequest>& reqs,
                             Clock::time_point deadline) {
    std::vector<bool> ok(reqs.size(), false);
    auto batch = options_.engine->SubmitBatch(reqs, deadline);
    if (!batch.ok()) return ok;
    (void)options_.engine->WaitBatch(*batch);
    for (size_t r = 0; r < reqs.size(); ++r) {
      ok[r] =
          options_.engine->GetRequestStatus(*batch, r).state == transfer::TransferState::kCompleted;
    }
    (void)options_.engine->FreeBatch(*batch);
    return ok;
  }

  // Reads objects[i] (its replica[i]) into dests[i] for i in todo; per todo entry, success.
  std::vector<bool> ReadObjects(const std::vector<FoundObject>& objects,
                                const std::vector<size_t>& replica, const std::vector<size_t>& todo,
                                const std::vector<void*>& dests, uint64_t size,
                                Clock::time_point deadline) {
    std::vector<bool> ok(todo.size(), false);
    std::map<std::string, std::vector<size_t>> by_segment;  // segment -> indexes into todo
    for (size_t t = 0; t < todo.size(); ++t) {
      by_segment[objects[todo[t]].replicas[replica[todo[t]]].segment].push_back(t);
    }
    for (const auto& [segment, entries] : by_segment) {
      auto handle = Open(segment);
      if (!handle.ok()) continue;  // gone: these replicas fail
      std::vector<transfer::TransferRequest> reqs;
      bool sizes_match = true;
      for (size_t t : entries) {
        const Location& l = objects[todo[t]].replicas[replica[todo[t]]];
        sizes_match = sizes_match && l.size == size;
        reqs.push_back({transfer::OpCode::kRead, dests[todo[t]], *handle, l.offset, size});
      }
      if (!sizes_match) continue;  // another geometry under the same key: never read it
      const std::vector<bool> results = RunBatch(reqs, deadline);
      bool any_failed = false;
      for (size_t r = 0; r < entries.size(); ++r) {
        ok[entries[r]] = results[r];
        any_failed = any_failed || !results[r];
      }
      if (any_failed) Forget(segment);  // reopen (the owner may have restarted)
    }
    return ok;
  }

  const PoolClientOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  internal::MasterChannel channel_;
  std::unique_ptr<SsdTier> ssd_;  // set once before use; thread-safe itself
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  std::map<std::string, uint64_t> mounts_ TANDEM_GUARDED_BY(mu_);  // segment -> bytes
  std::map<std::string, transfer::SegmentHandle> handles_ TANDEM_GUARDED_BY(mu_);
  PoolClientStats stats_ TANDEM_GUARDED_BY(mu_);
  std::thread heartbeat_;  // HeartbeatLoop, started by the first MountDram
};

}  // namespace

StatusOr<std::unique_ptr<PoolClient>> PoolClient::Create(PoolClientOptions options) {
  if (options.engine == nullptr) return InvalidArgument("the pool client needs a transfer engine");
  if (options.master_uri.empty() && !options.metadata) {
    return InvalidArgument("the pool client needs a master address or a metadata service");
  }
  if (!options.master_uri.empty())
    TANDEM_RETURN_IF_ERROR(internal::ParseHttpUri(options.master_uri).status());
  if (options.replicas < 1) return InvalidArgument("replicas must be at least 1");
  if (options.node.empty()) options.node = options.engine->local_name();
  std::unique_ptr<SsdTier> ssd;
  if (!options.ssd_dir.empty()) {
    TANDEM_ASSIGN_OR_RETURN(ssd, SsdTier::Open({options.ssd_dir, options.ssd_bytes}));
  }
  auto client = std::make_unique<PoolClientImpl>(std::move(options));
  client->SetSsdTier(std::move(ssd));
  return std::unique_ptr<PoolClient>(std::move(client));
}

}  // namespace tandem::store
