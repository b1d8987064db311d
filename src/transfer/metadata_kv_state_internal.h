// Private to tandem_metadata: the state of the HTTP metadata service (metadata_http_server.cc
// describes the protocol) with one entry point that takes a call's path and body and gives the
// reply, so that the service's logic runs without sockets (the HTTP server and the fuzzer).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace tandem::transfer::internal {

struct MetadataReply {
  int http_status = 200;  // 200, 400 (malformed call), 404 (unknown lease or key or path)
  std::string body;       // JSON: the reply, or {"error": "<why>"}
};

// Thread-safe: calls may come from any thread.
class MetadataKvState {
 public:
  MetadataKvState();
  ~MetadataKvState();
  MetadataKvState(const MetadataKvState&) = delete;
  MetadataKvState& operator=(const MetadataKvState&) = delete;

  // Serves one POST call: `path` one of http_protocol's paths, `body` its JSON text (any bytes:
  // anything but a JSON object is a 400).
  MetadataReply Call(std::string_view path, std::string_view body);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::transfer::internal
