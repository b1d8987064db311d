// PoolDirectory: Exist calls to the master through the shared channel.
#include <cstdio>

#include "store/master_channel_internal.h"
#include "store/pool.h"
#include "store/pool_protocol_internal.h"

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

std::string WindowNamespace(const std::string& ns) { return ns + ":window"; }

namespace {

class PoolDirectoryImpl final : public PoolDirectory {
 public:
  explicit PoolDirectoryImpl(const PoolDirectoryOptions& o)
      : channel_(o.master_uri, o.metadata, o.rpc_timeout, o.master_retry) {}

  StatusOr<int> HeldPrefix(const std::vector<std::string>& keys,
                           Clock::time_point deadline) override {
    TANDEM_ASSIGN_OR_RETURN(std::vector<bool> held, Held(keys, deadline));
    int n = 0;
    while (n < static_cast<int>(held.size()) && held[n]) ++n;
    return n;
  }

  StatusOr<std::vector<bool>> Held(const std::vector<std::string>& keys,
                                   Clock::time_point deadline) override {
    if (keys.empty()) return std::vector<bool>{};
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json reply,
                            channel_.Call("/pool/exist", {{"keys", keys}}, deadline));
    std::vector<bool> held;
    try {
      held = reply.at("exist").get<std::vector<bool>>();
    } catch (const nlohmann::json::exception& e) {
      return Internal(std::string("pool master reply: ") + e.what());
    }
    if (held.size() != keys.size()) {
      return Internal("pool master reply: " + std::to_string(held.size()) + " answers for " +
                      std::to_string(keys.size()) + " keys");
    }
    return held;
  }

  uint64_t master_unavailable() const override { return channel_.unavailable(); }

  StatusOr<PoolMasterStats> MasterStats(Clock::time_point deadline) override {
    TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, channel_.Get("/pool/stats", deadline));
    try {
      return internal::MasterStatsFromJson(j);
    } catch (const nlohmann::json::exception& e) {
      return Internal(std::string("pool master stats: ") + e.what());
    }
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
