// The "etcd://host:port" store: etcd's v3 API through its JSON gateway (etcd 3.4 serves it under
// /v3/; 3.3 used /v3beta/). Keys and values are base64 in the JSON; int64 fields (lease ids,
// TTLs) come back as JSON strings. Errors come back as {"error", "code" (a gRPC code), ...}
// with a non-200 HTTP status. Leases are handled by LeasedStore.
#include <algorithm>
#include <charconv>

#include "transfer/metadata_internal.h"
#include "transfer/metadata_leased.h"

namespace tandem::transfer::internal {
namespace {

using nlohmann::json;

constexpr int kGrpcInvalidArgument = 3;
constexpr int kGrpcNotFound = 5;
constexpr int kGrpcUnavailable = 14;

// An int64 field that etcd writes as a string ("42"), or as a number. Absent fields are 0
// (the gateway omits zero values).
StatusOr<int64_t> Int64Field(const json& obj, const char* field) {
  if (!obj.is_object() || !obj.contains(field)) return int64_t{0};
  const json& v = obj[field];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    int64_t out = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && ptr == s.data() + s.size()) return out;
  }
  return Internal(std::string("etcd reply field '") + field + "' is not an integer: " + v.dump());
}

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
// "\0" stands for "to the end of the key space".
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) != 0xff) {
      prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

class EtcdBackend final : public KvBackend {
 public:
  EtcdBackend(std::string host, int port, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), timeout_(timeout) {}

  std::string Describe() const override { return "etcd " + host_ + ":" + std::to_string(port_); }

  StatusOr<Lease> GrantLease(std::chrono::milliseconds ttl) override {
    // etcd leases count whole seconds (and etcd may raise a TTL to its minimum).
    const int64_t seconds = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
    TANDEM_ASSIGN_OR_RETURN(json body, Call("/v3/lease/grant", json{{"TTL", seconds}}));
    if (body.contains("error") && body["error"].is_string() &&
        !body["error"].get<std::string>().empty()) {
      return Unavailable(Describe() + ": lease grant refused: " + body["error"].get<std::string>());
    }
    TANDEM_ASSIGN_OR_RETURN(int64_t id, Int64Field(body, "ID"));
    TANDEM_ASSIGN_OR_RETURN(int64_t granted, Int64Field(body, "TTL"));
    if (id == 0 || granted <= 0) {
      return Internal(Describe() + ": malformed lease grant reply: " + body.dump());
    }
    return Lease{id, std::chrono::seconds(granted)};
  }

  Status KeepAlive(int64_t lease) override {
    // A streaming call: the gateway sends our one request and answers {"result": {...}}.
    TANDEM_ASSIGN_OR_RETURN(json body,
                            Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}));
    const json result = body.contains("result") ? body["result"] : body;
    TANDEM_ASSIGN_OR_RETURN(int64_t ttl, Int64Field(result, "TTL"));
    if (ttl <= 0) return NotFound(Describe() + ": lease " + std::to_string(lease) + " expired");
    return OkStatus();
  }

  Status Revoke(int64_t lease) override {
    return Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}).status();
  }

  Status Put(const std::string& key, const std::string& value, int64_t lease) override {
    json body{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
    if (lease != 0) body["lease"] = std::to_string(lease);  // etcd: no lease field, no lease
    return Call("/v3/kv/put", body).status();
  }

  StatusOr<std::string> Get(const std::string& key) override {
    TANDEM_ASSIGN_OR_RETURN(json body, Call("/v3/kv/range", json{{"key", Base64Encode(key)}}));
    TANDEM_ASSIGN_OR_RETURN(auto kvs, DecodeKvs(body));
    if (kvs.empty()) return NotFound("metadata key not found: " + key);
    return std::move(kvs.front().second);
  }

  Status Delete(const std::string& key) override {
    return Call("/v3/kv/deleterange", json{{"key", Base64Encode(key)}}).status();
  }

  StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override {
    const std::string start = prefix.empty() ? std::string(1, '\0') : prefix;
    TANDEM_ASSIGN_OR_RETURN(
        json body, Call("/v3/kv/range", json{{"key", Base64Encode(start)},
                                             {"range_end", Base64Encode(PrefixEnd(prefix))},
                                             {"sort_order", "ASCEND"},
                                             {"sort_target", "KEY"}}));
    return DecodeKvs(body);
  }

 private:
  StatusOr<std::vector<std::pair<std::string, std::string>>> DecodeKvs(const json& body) {
    std::vector<std::pair<std::string, std::string>> out;
    if (!body.contains("kvs")) return out;  // the gateway omits an empty list
    if (!body["kvs"].is_array()) return Internal(Describe() + ": malformed range reply");
    for (const json& kv : body["kvs"]) {
      if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string()) {
        return Internal(Describe() + ": malformed range entry: " + kv.dump());
      }
      TANDEM_ASSIGN_OR_RETURN(std::string key, Base64Decode(kv["key"].get<std::string>()));
      std::string value;  // an empty value is omitted
      if (kv.contains("value")) {
        if (!kv["value"].is_string()) return Internal(Describe() + ": malformed range value");
        TANDEM_ASSIGN_OR_RETURN(value, Base64Decode(kv["value"].get<std::string>()));
      }
      out.emplace_back(std::move(key), std::move(value));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // POSTs and maps gateway errors (a gRPC code in the body) to Status.
  StatusOr<json> Call(const char* path, const json& request) {
    TANDEM_ASSIGN_OR_RETURN(JsonReply reply, PostJson(host_, port_, path, request, timeout_,
                                                      /*cluster_call=*/false));
    if (reply.http_status == 200) return reply.body.is_object() ? reply.body : json::object();
    std::string why = reply.body.dump();
    int code = 0;
    if (reply.body.is_object()) {
      if (reply.body.contains("error") && reply.body["error"].is_string()) {
        why = reply.body["error"].get<std::string>();
      }
      if (reply.body.contains("code") && reply.body["code"].is_number_integer()) {
        code = reply.body["code"].get<int>();
      }
    }
    const std::string message =
        Describe() + path + " (HTTP " + std::to_string(reply.http_status) + "): " + why;
    switch (code) {
      case kGrpcNotFound: return NotFound(message);
      case kGrpcInvalidArgument: return InvalidArgument(message);
      case kGrpcUnavailable: return Unavailable(message);
      default: return Internal(message);
    }
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds timeout_;  // per call
};

}  // namespace

StatusOr<std::shared_ptr<MetadataStore>> OpenEtcdStore(const std::string& host, int port,
                                                       const MetadataOptions& options) {
  return LeasedStore::Open(std::make_unique<EtcdBackend>(host, port, options.timeout), options.ttl);
}

}  // namespace tandem::transfer::internal
