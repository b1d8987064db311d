// The one way tandem's HTTP servers bind and its HTTP clients get their deadlines (cpp-httplib).
// Three servers use it (the OpenAI front door, a worker's control endpoint, the metadata
// service) so that each gets the same socket options, backlog fix and timeouts.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>

#include "common/status.h"

namespace tandem {

// httplib's defaults unless a server says otherwise.
struct HttpServerSettings {
  int threads = 16;              // connections served at once (the rest wait in the backlog)
  int read_timeout_s = 5;        // a request not fully read by then is dropped
  int write_timeout_s = 5;       // a response not written by then is dropped
  int keep_alive_timeout_s = 5;  // an idle keep-alive connection is closed after this
  int keep_alive_max_count = 5;  // requests per connection
  // A cluster-internal server: with a cluster token installed (common/cluster_auth.h), every
  // call but GET .../health must carry a valid proof (else 401, counted and logged), and every
  // answer carries the server's proof. The OpenAI front door is not one.
  bool cluster_auth = false;
};

// Applies `settings`, sets SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which would
// let a second server bind the same port and silently take half the requests), binds host:port
// (0: any free port) and widens the listen backlog (common/listen_backlog.h). Returns the
// bound port, or Unavailable naming `what`. The server then runs with listen_after_bind().
StatusOr<int> BindHttpServer(httplib::Server& server, const std::string& host, int port,
                             const HttpServerSettings& settings, const std::string& what);

// Wraps a POST handler of a cluster-internal server: with a cluster token installed, it runs
// only when the body received is the one the call's proof signed (the proof itself was checked
// when the headers came: see HttpServerSettings::cluster_auth), else the call gets 401.
httplib::Server::Handler ClusterBodyChecked(httplib::Server::Handler handler);

// A call to a cluster-internal server: the headers proving the process's cluster token (none
// without one), and the nonce the answer's proof must cover.
struct ClusterCallHeaders {
  httplib::Headers headers;
  std::string nonce;  // empty without a token
};
ClusterCallHeaders SignClusterCall(const std::string& method, const std::string& path,
                                   const std::string& body);
// OK when `res` proves the token for the call signed with `nonce` (always, without a token);
// Unauthenticated otherwise: the peer is not part of the cluster, its answer is not to be used.
Status CheckClusterReply(const httplib::Response& res, const std::string& nonce,
                         const std::string& peer);

// Sets a client's timeouts from the time left until `deadline` (at least 1 ms): reading gets
// all of it, connecting at most `connect_cap`, writing at most `write_cap`.
void SetHttpClientDeadline(httplib::Client& client, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds connect_cap = std::chrono::seconds(2),
                           std::chrono::milliseconds write_cap = std::chrono::seconds(10));

}  // namespace tandem
