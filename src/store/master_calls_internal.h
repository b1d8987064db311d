// Internal to src/store: the pool master's POST calls (protocol in master_server.cc) run on a
// MasterState — what the HTTP server does for each request, under its lock. No I/O; `now` is
// the caller's. Bad input (not JSON, a field missing or of the wrong type, a number out of
// range, an unknown path) is a 400/404 reply with {"error"}, never a throw.
#pragma once

#include <string>
#include <vector>

#include "store/master_state.h"

namespace tandem::store::internal {

struct MasterReply {
  int http_status = 200;
  std::string body;  // a JSON object; ill-formed UTF-8 the caller sent is replaced, not echoed
};

// `path`: "/pool/mount", "/pool/put_start", ... (master_server.cc lists them).
MasterReply MasterCall(MasterState& state, const std::string& path, const std::string& body,
                       Clock::time_point now);
// The paths MasterCall serves (the server routes each of them to it).
std::vector<std::string> MasterCallPaths();

}  // namespace tandem::store::internal
