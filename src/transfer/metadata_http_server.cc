// MetadataHttpServer: the key-value endpoint behind "http://host:port" stores.
//
// Protocol. Every call is a POST with a JSON body and answers JSON. Keys and values are base64
// (any bytes). Lease ids are positive JSON integers. Errors answer {"error": "<why>"} with 400
// (malformed request) or 404 (unknown lease or key).
//   /v1/lease/grant      {"ttl_ms": N}                        -> {"lease": ID, "ttl_ms": N}
//   /v1/lease/keepalive  {"lease": ID}                        -> {"ttl_ms": N}      | 404
//   /v1/lease/revoke     {"lease": ID}                        -> {"deleted": count} | 404
//   /v1/kv/put           {"key": K, "value": V, "lease": ID}  -> {}                 | 404
//   /v1/kv/get           {"key": K}                           -> {"value": V}       | 404
//   /v1/kv/delete        {"key": K}                           -> {"deleted": 0 or 1}
//   /v1/kv/list          {"prefix": P}                        -> {"kvs": [{"key", "value"}...]}
//   /v1/health           (GET)                                -> {"ok": true}
// List answers the pairs whose key starts with P, sorted by key.
// Lease semantics. A lease lives ttl_ms (1 .. one day) after its grant or last keep-alive.
// A key belongs to the lease of its last put; when that lease expires or is revoked, the key
// goes. A put with lease 0 binds the key to no lease: it stays until deleted (durable). Expiry
// is checked on every request, so an expired key is never served.
#include <httplib.h>

#include <atomic>
#include <thread>

#include "common/http.h"
#include "common/logging.h"
#include "transfer/metadata_http_protocol_internal.h"
#include "transfer/metadata_internal.h"
#include "transfer/metadata_kv_state_internal.h"

namespace tandem::transfer {
namespace {

namespace proto = internal::http_protocol;
using nlohmann::json;

class HttpServerImpl final : public MetadataHttpServer {
 public:
  HttpServerImpl() {
    for (const char* path : {proto::kLeaseGrant, proto::kLeaseKeepAlive, proto::kLeaseRevoke,
                             proto::kPut, proto::kGet, proto::kDelete, proto::kList}) {
      server_.Post(path,
                   ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                     const internal::MetadataReply reply = state_.Call(req.path, req.body);
                     res.status = reply.http_status;
                     res.set_content(reply.body, "application/json");
                   }));
    }
    server_.Get(proto::kHealth, [](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"ok", true}}.dump(), "application/json");
    });
  }

  ~HttpServerImpl() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Listen(const std::string& host, int port) {
    // Clients do not keep connections, but a burst of them should not queue behind a few
    // threads: 16 threads and the widened backlog; otherwise httplib's defaults.
    TANDEM_ASSIGN_OR_RETURN(
        port_, BindHttpServer(server_, host, port, HttpServerSettings{.cluster_auth = true},
                              "metadata server"));
    // The socket already listens; connections queue until the thread accepts them.
    thread_ = std::thread([this] {
      server_.listen_after_bind();
      loop_ended_ = true;
    });
    // httplib's stop() does nothing until the loop runs: wait for it so that the destructor
    // always stops it.
    while (!server_.is_running() && !loop_ended_)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    GetLogger("metadata")->info("metadata server listening on {}:{}", host, port_);
    return OkStatus();
  }

  int port() const override { return port_; }

 private:
  internal::MetadataKvState state_;
  httplib::Server server_;
  int port_ = -1;
  std::atomic<bool> loop_ended_{false};  // listen_after_bind() has returned
  std::thread thread_;                   // runs server_.listen_after_bind()
};

}  // namespace

StatusOr<std::unique_ptr<MetadataHttpServer>> MetadataHttpServer::Start(const std::string& host,
                                                                        int port) {
  if (port < 0 || port > 65535) {
    return InvalidArgument("metadata server port " + std::to_string(port) + " not in 0..65535");
  }
  auto server = std::make_unique<HttpServerImpl>();
  TANDEM_RETURN_IF_ERROR(server->Listen(host, port));
  return std::unique_ptr<MetadataHttpServer>(std::move(server));
}

}  // namespace tandem::transfer
