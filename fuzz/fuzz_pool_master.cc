// The KV pool master's calls (store/master_calls_internal.h: what its HTTP server runs for each
// POST), a session of several calls on one fresh MasterState with a clock that advances.
// Input: lines; in each, byte 0 picks the call (mod 10: mount, unmount, put_start, put_end,
// replica_end, get, exist, remove, bad_replica, an unknown path) and the rest is the body.
// Properties: no crash or sanitizer report; every reply is a JSON object, with status 200 and
// no "error", or 400/404 with a string "error"; the space in use never exceeds the space
// mounted, in total and per segment.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "store/master_calls_internal.h"
#include "store/master_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static constexpr const char* kPaths[] = {
      "/pool/mount", "/pool/unmount", "/pool/put_start",   "/pool/put_end", "/pool/replica_end",
      "/pool/get",   "/pool/exist",   "/pool/bad_replica", "/pool/remove",  "/pool/unknown"};
  tandem::store::MasterOptions options;
  options.hot_gets = 2;  // reach the hot-copy paths too
  options.journal = true;
  tandem::store::MasterState state(options);
  tandem::store::Clock::time_point now{};
  int calls = 0;
  tandem::fuzz::ForEachLine(data, size, 64, [&](std::string_view line) {
    const auto reply = tandem::store::internal::MasterCall(
        state, kPaths[static_cast<uint8_t>(line[0]) % 10], std::string(line.substr(1)), now);
    const auto body = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    TANDEM_FUZZ_CHECK(body.is_object());
    if (reply.http_status == 200) {
      TANDEM_FUZZ_CHECK(!body.contains("error"));
    } else {
      TANDEM_FUZZ_CHECK(reply.http_status == 400 || reply.http_status == 404);
      TANDEM_FUZZ_CHECK(body.contains("error") && body["error"].is_string());
    }
    now += std::chrono::milliseconds(static_cast<uint8_t>(line[0]) * 10);
    if (++calls % 4 == 0) state.Expire(now);
    TANDEM_FUZZ_CHECK(state.used() <= state.capacity());
    for (const auto& u : state.Usage()) TANDEM_FUZZ_CHECK(u.used <= u.capacity);
    (void)state.TakeChanges();
  });
  return 0;
}
