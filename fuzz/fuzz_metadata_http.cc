// The metadata service's calls (transfer/metadata_kv_state_internal.h: what the HTTP server
// runs for each POST), a session of several calls on one fresh store.
// Input: lines; in each, byte 0 picks the call (mod 8: grant, keepalive, revoke, put, get,
// delete, list, an unknown path) and the rest is the body, where "$L" stands for the id of the
// lease granted last (ids are random, the fuzzer could not guess them).
// Properties: no crash or sanitizer report; every reply is JSON, an object, with status 200
// or an {"error"} with 400/404.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "transfer/metadata_http_protocol_internal.h"
#include "transfer/metadata_kv_state_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace proto = tandem::transfer::internal::http_protocol;
  static constexpr const char* kPaths[] = {
      proto::kLeaseGrant, proto::kLeaseKeepAlive, proto::kLeaseRevoke, proto::kPut,
      proto::kGet,        proto::kDelete,         proto::kList,        "/v1/kv/unknown"};
  tandem::transfer::internal::MetadataKvState state;
  std::string lease = "0";
  tandem::fuzz::ForEachLine(data, size, 64, [&](std::string_view line) {
    std::string call(line.substr(1));
    for (size_t at = call.find("$L"); at != std::string::npos; at = call.find("$L", at)) {
      call.replace(at, 2, lease);
      at += lease.size();
    }
    const auto reply = state.Call(kPaths[static_cast<uint8_t>(line[0]) % 8], call);
    const auto body = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    TANDEM_FUZZ_CHECK(body.is_object());
    if (reply.http_status == 200 && body.contains("lease")) lease = body["lease"].dump();
    if (reply.http_status == 200) {
      TANDEM_FUZZ_CHECK(!body.contains("error"));
    } else {
      TANDEM_FUZZ_CHECK(reply.http_status == 400 || reply.http_status == 404);
      TANDEM_FUZZ_CHECK(body.contains("error") && body["error"].is_string());
    }
  });
  return 0;
}
