// The metadata service's store: keys, values and leases (metadata_http_server.cc has the
// protocol and the lease semantics).
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_map>

#include "common/http_status.h"
#include "common/mutex.h"
#include "transfer/metadata_http_protocol_internal.h"
#include "transfer/metadata_internal.h"
#include "transfer/metadata_kv_state_internal.h"

namespace tandem::transfer::internal {
namespace {

namespace proto = http_protocol;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The store itself; all methods take the lock, expire what is due, then act. A handler's error
// becomes the HTTP status of the one Status mapping (common/http_status.h: 400 bad input, 404
// unknown lease or key) with {"error": message}; its value is the 200 reply's body.
class KvState {
 public:
  KvState() : rng_(std::random_device{}()) {}

  StatusOr<json> Grant(const json& req) TANDEM_EXCLUDES(mu_) {
    if (!req.contains("ttl_ms") || !req["ttl_ms"].is_number_integer()) {
      return InvalidArgument("ttl_ms (integer) required");
    }
    const long long ttl_ms = req["ttl_ms"].get<long long>();
    if (ttl_ms < 1 || ttl_ms > proto::kMaxTtlMs) {
      return InvalidArgument("ttl_ms must be in 1.." + std::to_string(proto::kMaxTtlMs));
    }
    MutexLock lock(&mu_);
    ExpireLocked();
    // Random ids: a client of a restarted server cannot renew a lease that is not its own.
    int64_t id = 0;
    do {
      id = static_cast<int64_t>(rng_() >> 11) + 1;  // 1 .. 2^53
    } while (leases_.count(id) != 0);
    Lease& lease = leases_[id];
    lease.ttl = std::chrono::milliseconds(ttl_ms);
    lease.deadline = Clock::now() + lease.ttl;
    return json{{"lease", id}, {"ttl_ms", ttl_ms}};
  }

  StatusOr<json> KeepAlive(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t id, LeaseId(req));
    MutexLock lock(&mu_);
    ExpireLocked();
    TANDEM_ASSIGN_OR_RETURN(auto it, FindLeaseLocked(id));
    it->second.deadline = Clock::now() + it->second.ttl;
    return json{{"ttl_ms", it->second.ttl.count()}};
  }

  StatusOr<json> Revoke(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t id, LeaseId(req));
    MutexLock lock(&mu_);
    ExpireLocked();
    TANDEM_ASSIGN_OR_RETURN(auto it, FindLeaseLocked(id));
    const size_t deleted = DropLeaseLocked(it);
    return json{{"deleted", deleted}};
  }

  StatusOr<json> Put(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(std::string key, Bytes(req, "key"));
    TANDEM_ASSIGN_OR_RETURN(std::string value, Bytes(req, "value"));
    if (key.empty()) return InvalidArgument("key must not be empty");
    const bool durable = req.contains("lease") && req["lease"] == 0;  // bound to no lease
    int64_t id = 0;
    if (!durable) {
      TANDEM_ASSIGN_OR_RETURN(id, LeaseId(req));
    }
    MutexLock lock(&mu_);
    ExpireLocked();
    if (!durable) {
      TANDEM_ASSIGN_OR_RETURN(auto lease, FindLeaseLocked(id));
      lease->second.keys.insert(key);
    }
    auto old = kv_.find(key);
    if (old != kv_.end() && old->second.lease != id) UnlinkLocked(key, old->second.lease);
    kv_[std::move(key)] = Entry{std::move(value), id};
    return json::object();
  }

  StatusOr<json> Get(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(const std::string key, Bytes(req, "key"));
    MutexLock lock(&mu_);
    ExpireLocked();
    auto it = kv_.find(key);
    if (it == kv_.end()) return NotFound("key not found");
    return json{{"value", Base64Encode(it->second.value)}};
  }

  StatusOr<json> Delete(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(const std::string key, Bytes(req, "key"));
    MutexLock lock(&mu_);
    ExpireLocked();
    auto it = kv_.find(key);
    if (it == kv_.end()) return json{{"deleted", 0}};
    UnlinkLocked(key, it->second.lease);
    kv_.erase(it);
    return json{{"deleted", 1}};
  }

  StatusOr<json> List(const json& req) TANDEM_EXCLUDES(mu_) {
    TANDEM_ASSIGN_OR_RETURN(const std::string prefix, Bytes(req, "prefix"));
    MutexLock lock(&mu_);
    ExpireLocked();
    json kvs = json::array();
    for (auto it = kv_.lower_bound(prefix);
         it != kv_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      kvs.push_back(
          json{{"key", Base64Encode(it->first)}, {"value", Base64Encode(it->second.value)}});
    }
    return json{{"kvs", std::move(kvs)}};
  }

 private:
  struct Lease {
    std::chrono::milliseconds ttl{0};
    Clock::time_point deadline;  // expires when now passes it
    std::set<std::string> keys;  // keys whose last put named this lease
  };
  struct Entry {
    std::string value;
    int64_t lease = 0;
  };
  using LeaseMap = std::unordered_map<int64_t, Lease>;

  static StatusOr<int64_t> LeaseId(const json& req) {
    if (req.contains("lease") && req["lease"].is_number_integer()) {
      const int64_t id = req["lease"].get<int64_t>();
      if (id > 0) return id;
    }
    return InvalidArgument("lease (positive integer) required");
  }

  // A base64 field, decoded.
  static StatusOr<std::string> Bytes(const json& req, const char* field) {
    if (!req.contains(field) || !req[field].is_string()) {
      return InvalidArgument(std::string(field) + " (base64 string) required");
    }
    StatusOr<std::string> decoded = Base64Decode(req[field].get<std::string>());
    if (!decoded.ok()) return decoded.status().WithContext(field);
    return decoded;
  }

  StatusOr<LeaseMap::iterator> FindLeaseLocked(int64_t id) TANDEM_REQUIRES(mu_) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return NotFound("lease " + std::to_string(id) + " not found");
    return it;
  }

  // Forgets that `key` belongs to lease `id` (the key itself stays).
  void UnlinkLocked(const std::string& key, int64_t id) TANDEM_REQUIRES(mu_) {
    auto it = leases_.find(id);
    if (it != leases_.end()) it->second.keys.erase(key);
  }

  // Removes the lease and its keys; returns how many keys went.
  size_t DropLeaseLocked(LeaseMap::iterator it) TANDEM_REQUIRES(mu_) {
    for (const std::string& key : it->second.keys) kv_.erase(key);
    const size_t n = it->second.keys.size();
    leases_.erase(it);
    return n;
  }

  void ExpireLocked() TANDEM_REQUIRES(mu_) {
    const Clock::time_point now = Clock::now();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline < now) {
        auto next = std::next(it);
        DropLeaseLocked(it);
        it = next;
      } else {
        ++it;
      }
    }
  }

  Mutex mu_;
  std::mt19937_64 rng_ TANDEM_GUARDED_BY(mu_);
  std::map<std::string, Entry> kv_ TANDEM_GUARDED_BY(mu_);  // sorted: List walks one range
  LeaseMap leases_ TANDEM_GUARDED_BY(mu_);
};

}  // namespace

class MetadataKvState::Impl : public KvState {};

MetadataKvState::MetadataKvState() : impl_(std::make_unique<Impl>()) {}
MetadataKvState::~MetadataKvState() = default;

MetadataReply MetadataKvState::Call(std::string_view path, std::string_view body) {
  using Handler = StatusOr<json> (KvState::*)(const json&);
  static const std::map<std::string_view, Handler> kRoutes = {
      {proto::kLeaseGrant, &KvState::Grant},
      {proto::kLeaseKeepAlive, &KvState::KeepAlive},
      {proto::kLeaseRevoke, &KvState::Revoke},
      {proto::kPut, &KvState::Put},
      {proto::kGet, &KvState::Get},
      {proto::kDelete, &KvState::Delete},
      {proto::kList, &KvState::List}};
  StatusOr<json> reply = NotFound("no call " + std::string(path));
  if (auto route = kRoutes.find(path); route != kRoutes.end()) {
    const json request = json::parse(body, nullptr, /*allow_exceptions=*/false);
    reply = request.is_object() ? (impl_.get()->*route->second)(request)
                                : InvalidArgument("request body must be a JSON object");
  }
  MetadataReply out;
  out.http_status = HttpStatusFor(reply.status().code());
  // Error texts may quote the caller's bytes: ill-formed UTF-8 is replaced, never a throw.
  out.body = (reply.ok() ? *reply : json{{"error", reply.status().message()}})
                 .dump(-1, ' ', false, json::error_handler_t::replace);
  return out;
}

}  // namespace tandem::transfer::internal
