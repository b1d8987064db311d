// Debian's cpp-httplib 0.11.4 listens with a backlog of 5 (compiled in), so a burst of new
// connections (32 clients starting at once) overflows the accept queue and clients stall or
// fail. Linux lets listen() be called again on a listening socket to change its backlog: this
// finds the process's listening socket bound to `port` (via /proc/self/fd) and widens it to
// SOMAXCONN. BindHttpServer (common/http.h), which every HTTP server of tandem binds with,
// calls it.
#pragma once

namespace tandem {

void WidenListenBacklog(int port);

}  // namespace tandem
