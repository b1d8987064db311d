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
};

// Applies `settings`, sets SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which would
// let a second server bind the same port and silently take half the requests), binds host:port
// (0: any free port) and widens the listen backlog (common/listen_backlog.h). Returns the
// bound port, or Unavailable naming `what`. The server then runs with listen_after_bind().
StatusOr<int> BindHttpServer(httplib::Server& server, const std::string& host, int port,
                             const HttpServerSettings& settings, const std::string& what);

// Sets a client's timeouts from the time left until `deadline` (at least 1 ms): reading gets
// all of it, connecting at most `connect_cap`, writing at most `write_cap`.
void SetHttpClientDeadline(httplib::Client& client, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds connect_cap = std::chrono::seconds(2),
                           std::chrono::milliseconds write_cap = std::chrono::seconds(10));

}  // namespace tandem
