// PoolMasterServer: MasterState behind HTTP + JSON, one lock, a thread that collects lapsed
// leases. Protocol (POST bodies and replies are JSON objects; errors {"error": "..."} with the
// HTTP status of common/http_status.h):
//   /pool/mount      {segment, node, capacity, ttl_ms}                 -> {}
//   /pool/unmount    {segment}                                         -> {}
//   /pool/put_start  {keys, size, replicas, node, ttl_ms}
//                    -> {results: [{decision: "reserved"|"exists"|"no_space", locations}]}
//   /pool/put_end    {keys, ok, checksums}                             -> {}
//   /pool/get        {keys, lease_ms}
//                    -> {objects: [{checksum, replicas: locations, replicate_to?: location}]}
//   /pool/replica_end {key, segment, ok}                               -> {}
//   /pool/exist      {keys}                                            -> {exist: [bool]}
//   /pool/remove     {keys}                                            -> {removed: n}
//   /pool/bad_replica {key, segment}                                   -> {}
//   GET /pool/stats  -> {capacity, used, objects, segments: [...], counters: {...}}
// A location is {segment, node, offset, size}; a checksum is the XXH3-64 of an object's bytes.
// With a journal (PoolMasterOptions::journal), the state's records are kept, bound to no lease,
// under kJournalPrefix in the metadata service: "objects/<key>" -> {size, checksum, replicas},
// "segments/<name>" -> {node, capacity}. A master that starts with a journal restores them
// before it serves (the segments' owners renew their mounts within their TTL).
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/http.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "store/master_calls_internal.h"
#include "store/pool.h"
#include "store/pool_protocol_internal.h"
#include "transfer/metadata.h"

namespace tandem::store {
namespace {

using json = nlohmann::json;

MasterOptions WithJournal(const PoolMasterOptions& o) {
  MasterOptions policy = o.policy;
  policy.journal = o.journal;
  return policy;
}

class MasterServerImpl final : public PoolMasterServer {
 public:
  explicit MasterServerImpl(PoolMasterOptions options)
      : options_(options), state_(WithJournal(options)) {
    for (const std::string& path : internal::MasterCallPaths()) {
      server_.Post(path,
                   ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                     internal::MasterReply reply;
                     {
                       MutexLock lock(&mu_);
                       reply = internal::MasterCall(state_, req.path, req.body, Clock::now());
                     }
                     res.status = reply.http_status;
                     res.set_content(reply.body, "application/json");
                   }));
    }
    server_.Get("/pool/stats", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(StatsJson().dump(), "application/json");
    });
  }

  ~MasterServerImpl() override {
    stop_ = true;
    server_.stop();
    if (thread_.joinable()) thread_.join();
    if (expirer_.joinable()) expirer_.join();
    if (journaler_.joinable()) journaler_.join();
    if (options_.journal && metadata_) FlushJournal();  // the last changes (best effort)
    if (metadata_) {  // best effort (the lease ends it anyway); never another master's key
      auto published = metadata_->Get(kMasterKey);
      if (published.ok() && *published == uri()) (void)metadata_->Delete(kMasterKey);
    }
  }

  Status Listen(const std::string& host, int port,
                std::shared_ptr<transfer::MetadataStore> metadata) {
    if (options_.journal) {
      if (!metadata) return InvalidArgument("a pool master journal needs a metadata service");
      TANDEM_RETURN_IF_ERROR(RestoreJournal(*metadata));
    }
    TANDEM_ASSIGN_OR_RETURN(
        port_, BindHttpServer(server_, host, port, HttpServerSettings{.cluster_auth = true},
                              "pool master"));
    host_ = host;
    thread_ = std::thread([this] {
      server_.listen_after_bind();
      loop_ended_ = true;
    });
    while (!server_.is_running() && !loop_ended_)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    expirer_ = std::thread([this] { ExpireLoop(); });
    if (metadata) {
      metadata_ = std::move(metadata);
      if (options_.journal) journaler_ = std::thread([this] { JournalLoop(); });
      TANDEM_RETURN_IF_ERROR(metadata_->Put(kMasterKey, uri()));
    }
    GetLogger("pool")->info("pool master listening on {}", uri());
    return OkStatus();
  }

  int port() const override { return port_; }
  std::string uri() const override { return "http://" + host_ + ":" + std::to_string(port_); }

  std::vector<SegmentUsage> Usage() const override {
    MutexLock lock(&mu_);
    return state_.Usage();
  }
  MasterCounters Counters() const override {
    MutexLock lock(&mu_);
    return state_.counters();
  }
  uint64_t JournalFailures() const override { return journal_failures_.load(); }

 private:
  json StatsJson() const {
    PoolMasterStats stats;
    {
      MutexLock lock(&mu_);
      stats.capacity = state_.capacity();
      stats.used = state_.used();
      stats.objects = state_.visible_objects();
      stats.segments = state_.Usage();
      stats.counters = state_.counters();
    }
    stats.journal_failures = journal_failures_.load();
    return internal::MasterStatsToJson(stats);
  }

  // Reads the journal into the state (before the server answers anyone).
  Status RestoreJournal(transfer::MetadataStore& metadata) {
    const std::string seg_prefix = std::string(kJournalPrefix) + "segments/";
    const std::string obj_prefix = std::string(kJournalPrefix) + "objects/";
    TANDEM_ASSIGN_OR_RETURN(auto seg_kvs, metadata.List(seg_prefix));
    TANDEM_ASSIGN_OR_RETURN(auto obj_kvs, metadata.List(obj_prefix));
    std::vector<SegmentRecord> segments;
    std::vector<ObjectRecord> objects;
    size_t malformed = 0;
    for (const auto& [key, value] : seg_kvs) {
      const json j = json::parse(value, nullptr, /*allow_exceptions=*/false);
      try {
        segments.push_back({key.substr(seg_prefix.size()), j.at("node").get<std::string>(),
                            j.at("capacity").get<uint64_t>()});
      } catch (const json::exception&) {
        ++malformed;
      }
    }
    for (const auto& [key, value] : obj_kvs) {
      const json j = json::parse(value, nullptr, /*allow_exceptions=*/false);
      try {
        objects.push_back(internal::ObjectRecordFromJson(key.substr(obj_prefix.size()), j));
      } catch (const json::exception&) {
        ++malformed;
        (void)metadata.Delete(key);
      }
    }
    MutexLock lock(&mu_);
    const int restored = state_.Restore(segments, objects, Clock::now() + options_.restore_grace);
    GetLogger("pool")->info(
        "pool master journal: {} segments, {} of {} objects restored ({} malformed records)",
        segments.size(), restored, objects.size(), malformed);
    return OkStatus();
  }

  // Writes the records changed since the last call; what fails is retried next time.
  void FlushJournal() {
    {
      MutexLock lock(&mu_);
      const MasterChanges changes = state_.TakeChanges();
      for (const std::string& name : changes.segments) {
        SegmentRecord r;
        unsynced_[std::string(kJournalPrefix) + "segments/" + name] =
            state_.SegmentRecordOf(name, &r)
                ? std::optional<std::string>(
                      json{{"node", r.node}, {"capacity", r.capacity}}.dump())
                : std::nullopt;
      }
      for (const std::string& key : changes.objects) {
        ObjectRecord r;
        unsynced_[std::string(kJournalPrefix) + "objects/" + key] =
            state_.ObjectRecordOf(key, &r)
                ? std::optional<std::string>(internal::ObjectRecordToJson(r).dump())
                : std::nullopt;
      }
    }
    for (auto it = unsynced_.begin(); it != unsynced_.end();) {
      const Status st =
          it->second ? metadata_->PutDurable(it->first, *it->second) : metadata_->Delete(it->first);
      if (!st.ok()) {  // the metadata service is away: try again next time
        ++journal_failures_;
        return;
      }
      it = unsynced_.erase(it);
    }
  }

  void JournalLoop() {
    while (!stop_) {
      std::this_thread::sleep_for(options_.journal_interval);
      FlushJournal();
    }
  }

  void ExpireLoop() {
    while (!stop_) {
      std::this_thread::sleep_for(options_.expire_interval);
      MutexLock lock(&mu_);
      state_.Expire(Clock::now());
    }
  }

  PoolMasterOptions options_;
  mutable Mutex mu_;
  MasterState state_ TANDEM_GUARDED_BY(mu_);
  httplib::Server server_;
  std::string host_;
  int port_ = -1;
  std::shared_ptr<transfer::MetadataStore> metadata_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> loop_ended_{false};
  std::thread thread_;   // server_.listen_after_bind()
  std::thread expirer_;  // ExpireLoop
  // Journal: records not yet written (metadata key -> value; nullopt: delete). Used only by
  // the journal thread (and by the destructor after it has stopped).
  std::map<std::string, std::optional<std::string>> unsynced_;
  std::atomic<uint64_t> journal_failures_{0};
  std::thread journaler_;  // JournalLoop
};

}  // namespace

StatusOr<std::unique_ptr<PoolMasterServer>> PoolMasterServer::Start(
    const std::string& host, int port, PoolMasterOptions options,
    std::shared_ptr<transfer::MetadataStore> metadata) {
  if (port < 0 || port > 65535) return InvalidArgument("pool master port not in 0..65535");
  auto server = std::make_unique<MasterServerImpl>(options);
  TANDEM_RETURN_IF_ERROR(server->Listen(host, port, std::move(metadata)));
  return std::unique_ptr<PoolMasterServer>(std::move(server));
}

}  // namespace tandem::store
