#include "common/http.h"

#include <sys/socket.h>

#include <algorithm>
#include <memory>

#include "common/cluster_auth.h"
#include "common/listen_backlog.h"
#include "common/logging.h"

namespace tandem {
namespace {

// A 401 for a call without a valid cluster token proof: counted and logged.
void Refuse(const std::string& what, const httplib::Request& req, const std::string& why,
            httplib::Response& res) {
  CountClusterAuthRefusal();
  GetLogger("auth")->warn("{}: refused {} {} from {}: {}", what, req.method, req.path,
                          req.remote_addr, why);
  res.status = 401;
  res.set_content(R"({"error":{"code":"UNAUTHENTICATED","message":")" + why + "\"}}",
                  "application/json");
}

}  // namespace

httplib::Server::Handler ClusterBodyChecked(httplib::Server::Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    if (InstalledClusterToken() != nullptr &&
        !BodyMatchesCall(req.get_header_value(kAuthHeader), req.body)) {
      Refuse("body check", req, "the body is not the one the cluster token proof signed", res);
      return;
    }
    handler(req, res);
  };
}

StatusOr<int> BindHttpServer(httplib::Server& server, const std::string& host, int port,
                             const HttpServerSettings& s, const std::string& what) {
  const int threads = std::max(1, s.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_read_timeout(s.read_timeout_s, 0);
  server.set_write_timeout(s.write_timeout_s, 0);
  server.set_keep_alive_timeout(s.keep_alive_timeout_s);
  server.set_keep_alive_max_count(s.keep_alive_max_count);
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (s.cluster_auth && InstalledClusterToken() != nullptr) {
    auto verifier = std::make_shared<CallVerifier>();
    server.set_pre_routing_handler([verifier, what](const httplib::Request& req,
                                                    httplib::Response& res) {
      const ClusterToken* token = InstalledClusterToken();
      const bool health = req.method == "GET" && req.path.ends_with("/health");
      if (token == nullptr || health) return httplib::Server::HandlerResponse::Unhandled;
      std::string nonce;
      const Status st =
          verifier->Verify(*token, req.get_header_value(kAuthHeader), req.method, req.path, &nonce);
      if (!st.ok()) {
        Refuse(what, req, st.message(), res);
        return httplib::Server::HandlerResponse::Handled;
      }
      res.set_header(kAuthReplyHeader, ReplyProof(*token, nonce));
      return httplib::Server::HandlerResponse::Unhandled;
    });
  }
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return Unavailable(what + " cannot bind " + host + ":" + std::to_string(port));
  }
  WidenListenBacklog(bound);
  return bound;
}

ClusterCallHeaders SignClusterCall(const std::string& method, const std::string& path,
                                   const std::string& body) {
  ClusterCallHeaders out;
  if (const ClusterToken* token = InstalledClusterToken()) {
    SignedCall call = SignCall(*token, method, path, body);
    out.headers.emplace(kAuthHeader, std::move(call.header));
    out.nonce = std::move(call.nonce);
  }
  return out;
}

Status CheckClusterReply(const httplib::Response& res, const std::string& nonce,
                         const std::string& peer) {
  const ClusterToken* token = InstalledClusterToken();
  if (token == nullptr) return OkStatus();
  if (res.status == 401) {
    return Unauthenticated(peer + " refused this process's cluster token (different tokens?)");
  }
  if (!ConstantTimeEqual(res.get_header_value(kAuthReplyHeader), ReplyProof(*token, nonce))) {
    CountClusterAuthRefusal();
    GetLogger("auth")->warn("{} answered without a valid cluster token proof", peer);
    return Unauthenticated(peer + " did not prove it holds the cluster token");
  }
  return OkStatus();
}

void SetHttpClientDeadline(httplib::Client& c, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds connect_cap,
                           std::chrono::milliseconds write_cap) {
  const int64_t left = std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                               deadline - std::chrono::steady_clock::now())
                                               .count(),
                                           1, 24LL * 3600 * 1000);
  using std::chrono::milliseconds;
  c.set_connection_timeout(milliseconds(std::min<int64_t>(left, connect_cap.count())));
  c.set_read_timeout(milliseconds(left));
  c.set_write_timeout(milliseconds(std::min<int64_t>(left, write_cap.count())));
}

}  // namespace tandem
