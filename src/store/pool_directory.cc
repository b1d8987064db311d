// PoolDirectory: Exist calls to the master through the shared channel.
#include <cstdio>

#include "store/master_channel_internal.h"
#include "store/pool.h"

namespace tandem::store {

std::string PoolNamespace(const std::string& model, int n_layers, int n_kv_heads, int head_dim,
                          int block_tokens, const std::string& dtype) {
  return model + ":L" + std::to_string(n_layers) + ":H" + std::to_string(n_kv_heads) + "x" +
         std::to_string(head_dim) + ":B" + std::to_string(block_tokens) + ":" + dtype;
}

std::string ObjectKey(const std::string& ns, uint64_t prefix_hash) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(prefix_hash));
  return ns + "/" + hex;
}

namespace {

class PoolDirectoryImpl final : public PoolDirectory {
 public:
  explicit PoolDirectoryImpl(const PoolDirectoryOptions& o)
      : channel_(o.master_uri, o.metadata, o.rpc_timeout, o.master_retry) {}

  StatusOr<int> HeldPrefix(const std::vector<std::string>& keys,
                           Clock::time_point deadline) override {
    if (keys.empty()) return 0;
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json reply,
                            channel_.Call("/pool/exist", {{"keys", keys}}, deadline));
    std::vector<bool> held;
    try {
      held = reply.at("exist").get<std::vector<bool>>();
    } catch (const nlohmann::json::exception& e) {
      return Internal(std::string("pool master reply: ") + e.what());
    }
    int n = 0;
    while (n < static_cast<int>(held.size()) && n < static_cast<int>(keys.size()) && held[n]) ++n;
    return n;
  }

  uint64_t master_unavailable() const override { return channel_.unavailable(); }

  StatusOr<PoolMasterStats> MasterStats(Clock::time_point deadline) override {
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, channel_.Get("/pool/stats", deadline));
    PoolMasterStats s;
    try {
      s.capacity = j.at("capacity").get<uint64_t>();
      s.used = j.at("used").get<uint64_t>();
      s.objects = j.at("objects").get<uint64_t>();
      for (const auto& seg : j.at("segments")) {
        s.segments.push_back({seg.at("name").get<std::string>(), seg.at("node").get<std::string>(),
                              seg.at("capacity").get<uint64_t>(), seg.at("used").get<uint64_t>(),
                              seg.at("objects").get<int>()});
      }
      const auto& c = j.at("counters");
      MasterCounters& m = s.counters;
      m.puts_committed = c.value("puts_committed", uint64_t{0});
      m.puts_aborted = c.value("puts_aborted", uint64_t{0});
      m.puts_expired = c.value("puts_expired", uint64_t{0});
      m.puts_no_space = c.value("puts_no_space", uint64_t{0});
      m.puts_existing = c.value("puts_existing", uint64_t{0});
      m.get_hits = c.value("get_hits", uint64_t{0});
      m.get_misses = c.value("get_misses", uint64_t{0});
      m.evictions = c.value("evictions", uint64_t{0});
      m.replicas_lost = c.value("replicas_lost", uint64_t{0});
      m.objects_lost = c.value("objects_lost", uint64_t{0});
      m.removed = c.value("removed", uint64_t{0});
      m.hot_replicas = c.value("hot_replicas", uint64_t{0});
      m.restored = c.value("restored", uint64_t{0});
      s.journal_failures = c.value("journal_failures", uint64_t{0});
    } catch (const nlohmann::json::exception& e) {
      return Internal(std::string("pool master stats: ") + e.what());
    }
    return s;
  }

 private:
  internal::MasterChannel channel_;
};

}  // namespace

StatusOr<std::unique_ptr<PoolDirectory>> PoolDirectory::Create(PoolDirectoryOptions options) {
  if (options.master_uri.empty() && !options.metadata) {
    return InvalidArgument("the pool directory needs a master address or a metadata service");
  }
  if (!options.master_uri.empty()) {
    TANDEM_RETURN_IF_ERROR(internal::ParseHttpUri(options.master_uri).status());
  }
  return std::unique_ptr<PoolDirectory>(new PoolDirectoryImpl(options));
}

}  // namespace tandem::store
