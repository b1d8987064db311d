#include "conductor/worker_client.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/http.h"

namespace tandem::conductor {
namespace {

constexpr size_t kMaxIdleConnections = 16;

// One call signed with the cluster token (common/http.h); *auth: whether the answer proves it.
httplib::Result CallWorker(httplib::Client& c, const std::string& method, const std::string& path,
                           const std::string& body, const std::string& peer, Status* auth) {
  ClusterCallHeaders signed_call = SignClusterCall(method, path, body);
  httplib::Result res = method == "GET"
                            ? c.Get(path, signed_call.headers)
                            : c.Post(path, signed_call.headers, body, "application/json");
  *auth = res ? CheckClusterReply(*res, signed_call.nonce, peer) : OkStatus();
  return res;
}

}  // namespace

WorkerClient::WorkerClient(std::string host, int port) : host_(std::move(host)), port_(port) {}
WorkerClient::~WorkerClient() = default;

std::unique_ptr<httplib::Client> WorkerClient::NewClient(Clock::time_point deadline,
                                                         bool keep_alive) const {
  auto c = std::make_unique<httplib::Client>(host_, port_);
  c->set_keep_alive(keep_alive);
  SetHttpClientDeadline(*c, deadline);
  return c;
}

std::unique_ptr<httplib::Client> WorkerClient::Take(Clock::time_point deadline) {
  std::unique_ptr<httplib::Client> c;
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!c) return NewClient(deadline, /*keep_alive=*/true);
  SetHttpClientDeadline(*c, deadline);
  return c;
}

void WorkerClient::Give(std::unique_ptr<httplib::Client> c) {
  MutexLock lock(&mu_);
  if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(c));
}

std::string WorkerClient::Peer() const { return "worker " + host_ + ":" + std::to_string(port_); }

StatusOr<cluster::WorkerStats> WorkerClient::Stats(Clock::time_point deadline) {
  auto c = Take(deadline);
  Status auth;
  auto res = CallWorker(*c, "GET", "/stats", "", Peer(), &auth);
  if (!res) return Unavailable("no answer to /stats: " + httplib::to_string(res.error()));
  TANDEM_RETURN_IF_ERROR(auth);
  if (res->status != 200) return Unavailable("/stats answered " + std::to_string(res->status));
  auto stats = cluster::WorkerStats::FromJson(res->body);
  Give(std::move(c));
  return stats;
}

StatusOr<cluster::PrefillResult> WorkerClient::Prefill(const cluster::PrefillCall& call,
                                                       Clock::time_point deadline,
                                                       bool* connection_failed) {
  // Slack past the request's deadline: the worker answers with its own timeout first.
  auto c = Take(deadline + std::chrono::seconds(5));
  Status auth;
  auto res = CallWorker(*c, "POST", "/v1/prefill", call.ToJson(), Peer(), &auth);
  if (!res) {
    if (connection_failed) *connection_failed = true;
    return Unavailable("connection failed: " + httplib::to_string(res.error()));
  }
  TANDEM_RETURN_IF_ERROR(auth);
  Give(std::move(c));
  if (res->status != 200) {
    return cluster::StatusFromErrorJson(res->body, "answered " + std::to_string(res->status));
  }
  return cluster::PrefillResult::FromJson(res->body);
}

StatusOr<std::string> WorkerClient::PostControl(const char* path, const std::string& body,
                                                Clock::time_point deadline) {
  auto c = Take(deadline);
  Status auth;
  auto res = CallWorker(*c, "POST", path, body, Peer(), &auth);
  if (!res) {
    return Unavailable(std::string("no answer to ") + path + ": " +
                       httplib::to_string(res.error()));
  }
  TANDEM_RETURN_IF_ERROR(auth);
  Give(std::move(c));
  if (res->status != 200) {
    return cluster::StatusFromErrorJson(res->body, "answered " + std::to_string(res->status));
  }
  return std::move(res->body);
}

StatusOr<cluster::RoleChangeResult> WorkerClient::ChangeRole(const cluster::RoleChange& change,
                                                             Clock::time_point deadline) {
  TANDEM_ASSIGN_OR_RETURN(std::string body, PostControl("/v1/role", change.ToJson(), deadline));
  return cluster::RoleChangeResult::FromJson(body);
}

StatusOr<cluster::ThreadsChangeResult> WorkerClient::ChangeThreads(
    const cluster::ThreadsChange& change, Clock::time_point deadline) {
  TANDEM_ASSIGN_OR_RETURN(std::string body, PostControl("/v1/threads", change.ToJson(), deadline));
  return cluster::ThreadsChangeResult::FromJson(body);
}

void WorkerClient::Cancel(const std::string& id, Clock::time_point deadline) {
  auto c = Take(deadline);
  Status auth;
  auto res = CallWorker(*c, "POST", "/v1/cancel", nlohmann::json{{"id", id}}.dump(), Peer(), &auth);
  if (res && auth.ok()) Give(std::move(c));
}

Status WorkerClient::Decode(const cluster::DecodeCall& call, Clock::time_point deadline,
                            const std::function<bool(const cluster::DecodeEvent&)>& on_event,
                            bool* connection_failed) {
  auto c = NewClient(deadline + std::chrono::seconds(5), /*keep_alive=*/false);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/decode";
  req.body = call.ToJson();
  req.set_header("Content-Type", "application/json");
  ClusterCallHeaders signed_call = SignClusterCall(req.method, req.path, req.body);
  for (auto& [name, value] : signed_call.headers) req.set_header(name.c_str(), value);
  int http_status = 0;
  std::string error_body, buffer;
  Status parse_error, auth;
  bool stopped = false;
  req.response_handler = [&](const httplib::Response& res) {
    http_status = res.status;
    // Nothing of the stream is used unless the worker proves it holds the cluster token.
    auth = CheckClusterReply(res, signed_call.nonce, Peer());
    return auth.ok();
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (http_status != 200) {
      error_body.append(data, len);
      return true;
    }
    buffer.append(data, len);
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      auto e = cluster::DecodeEvent::FromJson(buffer.substr(start, nl - start));
      if (!e.ok()) {
        parse_error = e.status();
        return false;
      }
      if (!on_event(*e)) {
        stopped = true;
        return false;
      }
    }
    buffer.erase(0, start);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = c->send(req, res, err);
  TANDEM_RETURN_IF_ERROR(auth);
  if (!parse_error.ok()) return parse_error;
  if (http_status != 0 && http_status != 200) {
    return cluster::StatusFromErrorJson(error_body, "answered " + std::to_string(http_status));
  }
  if (stopped) return OkStatus();
  if (!sent) {
    if (connection_failed) *connection_failed = true;
    return Unavailable("connection failed: " + httplib::to_string(err));
  }
  return OkStatus();
}

}  // namespace tandem::conductor
