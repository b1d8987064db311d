#include "common/http.h"

#include <sys/socket.h>

#include <algorithm>

#include "common/listen_backlog.h"

namespace tandem {

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
