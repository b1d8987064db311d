// Internal to src/store: the HTTP calls to the pool master (protocol in master_server.cc),
// shared by PoolClient and PoolDirectory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "store/master_state.h"

namespace tandem::transfer {
class MetadataStore;
}

namespace tandem::store::internal {

// "http://host:port" -> host, port.
StatusOr<std::pair<std::string, int>> ParseHttpUri(const std::string& uri);

// Finds the master (the configured address, else the one published under kMasterKey in the
// metadata service, remembered until a call to it fails), bounds each call by rpc_timeout
// within the caller's deadline, signs it as a cluster call and checks the reply's proof. After
// a call that found no master, calls fail at once (Unavailable) for master_retry, so that a
// cluster without a master pays nothing per request. Thread-safe.
class MasterChannel {
 public:
  MasterChannel(std::string master_uri, std::shared_ptr<transfer::MetadataStore> metadata,
                std::chrono::milliseconds rpc_timeout, std::chrono::milliseconds master_retry);

  // POSTs `body` to `path`; the reply's JSON object, or the master's error as a status.
  StatusOr<nlohmann::json> Call(const std::string& path, const nlohmann::json& body,
                                Clock::time_point deadline) TANDEM_EXCLUDES(mu_);
  // GETs `path` (e.g. /pool/stats); the reply's JSON object.
  StatusOr<nlohmann::json> Get(const std::string& path, Clock::time_point deadline)
      TANDEM_EXCLUDES(mu_);
  // Calls that found no master so far.
  uint64_t unavailable() const TANDEM_EXCLUDES(mu_);

 private:
  StatusOr<nlohmann::json> Send(const char* method, const std::string& path,
                                const std::string& text, Clock::time_point deadline)
      TANDEM_EXCLUDES(mu_);
  StatusOr<std::pair<std::string, int>> Master() TANDEM_EXCLUDES(mu_);
  void NoMaster() TANDEM_EXCLUDES(mu_);

  const std::string master_uri_;
  const std::shared_ptr<transfer::MetadataStore> metadata_;
  const std::chrono::milliseconds rpc_timeout_, master_retry_;
  mutable Mutex mu_;
  Clock::time_point no_master_until_ TANDEM_GUARDED_BY(mu_){};
  std::string published_master_ TANDEM_GUARDED_BY(mu_);  // empty: look it up
  uint64_t unavailable_ TANDEM_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::store::internal
