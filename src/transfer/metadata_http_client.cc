// The "http://host:port" store: the client of MetadataHttpServer's protocol (described in
// metadata_http_server.cc). Leases are handled by LeasedStore; this file only speaks the wire.
#include "common/http_status.h"
#include "transfer/metadata_http_protocol_internal.h"
#include "transfer/metadata_internal.h"
#include "transfer/metadata_leased.h"

namespace tandem::transfer::internal {
namespace {

namespace proto = http_protocol;
using nlohmann::json;

class HttpBackend final : public KvBackend {
 public:
  HttpBackend(std::string host, int port, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), timeout_(timeout) {}

  std::string Describe() const override {
    return "metadata server " + host_ + ":" + std::to_string(port_);
  }

  StatusOr<Lease> GrantLease(std::chrono::milliseconds ttl) override {
    TANDEM_ASSIGN_OR_RETURN(json body, Call(proto::kLeaseGrant, json{{"ttl_ms", ttl.count()}}));
    if (!body.contains("lease") || !body["lease"].is_number_integer() || !body.contains("ttl_ms") ||
        !body["ttl_ms"].is_number_integer()) {
      return Internal(Describe() + ": malformed lease grant reply: " + body.dump());
    }
    return Lease{body["lease"].get<int64_t>(),
                 std::chrono::milliseconds(body["ttl_ms"].get<int64_t>())};
  }

  Status KeepAlive(int64_t lease) override {
    return Call(proto::kLeaseKeepAlive, json{{"lease", lease}}).status();
  }

  Status Revoke(int64_t lease) override {
    return Call(proto::kLeaseRevoke, json{{"lease", lease}}).status();
  }

  Status Put(const std::string& key, const std::string& value, int64_t lease) override {
    return Call(proto::kPut,
                json{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}, {"lease", lease}})
        .status();
  }

  StatusOr<std::string> Get(const std::string& key) override {
    StatusOr<json> body = Call(proto::kGet, json{{"key", Base64Encode(key)}});
    if (body.status().code() == StatusCode::kNotFound) {
      return NotFound("metadata key not found: " + key);
    }
    if (!body.ok()) return body.status();
    if (!body->contains("value") || !(*body)["value"].is_string()) {
      return Internal(Describe() + ": malformed get reply: " + body->dump());
    }
    return Base64Decode((*body)["value"].get<std::string>());
  }

  Status Delete(const std::string& key) override {
    return Call(proto::kDelete, json{{"key", Base64Encode(key)}}).status();
  }

  StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override {
    TANDEM_ASSIGN_OR_RETURN(json body, Call(proto::kList, json{{"prefix", Base64Encode(prefix)}}));
    if (!body.contains("kvs") || !body["kvs"].is_array()) {
      return Internal(Describe() + ": malformed list reply");
    }
    std::vector<std::pair<std::string, std::string>> out;
    for (const json& kv : body["kvs"]) {
      if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string() ||
          !kv.contains("value") || !kv["value"].is_string()) {
        return Internal(Describe() + ": malformed list entry: " + kv.dump());
      }
      TANDEM_ASSIGN_OR_RETURN(std::string key, Base64Decode(kv["key"].get<std::string>()));
      TANDEM_ASSIGN_OR_RETURN(std::string value, Base64Decode(kv["value"].get<std::string>()));
      out.emplace_back(std::move(key), std::move(value));
    }
    return out;
  }

 private:
  // POSTs and maps the HTTP status back to a Status (common/http_status.h): 200 -> body,
  // 404 -> NotFound, 400 -> InvalidArgument, ...
  StatusOr<json> Call(const char* path, const json& request) {
    TANDEM_ASSIGN_OR_RETURN(JsonReply reply, PostJson(host_, port_, path, request, timeout_,
                                                      /*cluster_call=*/true));
    const std::string why = reply.body.is_object() && reply.body.contains("error")
                                ? reply.body["error"].dump()
                                : reply.body.dump();
    const StatusCode code = StatusCodeForHttp(reply.http_status);
    if (code == StatusCode::kOk) return reply.body.is_object() ? reply.body : json::object();
    return Status(code, Describe() + path + " answered HTTP " + std::to_string(reply.http_status) +
                            ": " + why);
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds timeout_;  // per call
};

}  // namespace

StatusOr<std::shared_ptr<MetadataStore>> OpenHttpStore(const std::string& host, int port,
                                                       const MetadataOptions& options) {
  return LeasedStore::Open(std::make_unique<HttpBackend>(host, port, options.timeout), options.ttl);
}

}  // namespace tandem::transfer::internal
