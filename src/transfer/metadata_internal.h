// Private to tandem_metadata: the constructors of each backend, called by OpenMetadataStore
// (metadata.cc) once the URI has been parsed, and small helpers shared by the backends.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "transfer/metadata.h"

namespace tandem::transfer::internal {

// name: the part after "embedded:" (may be empty: the default shared map).
StatusOr<std::shared_ptr<MetadataStore>> OpenEmbeddedStore(const std::string& name);

// host, port: the server's loopback or network address (port in 1..65535).
StatusOr<std::shared_ptr<MetadataStore>> OpenHttpStore(const std::string& host, int port,
                                                       const MetadataOptions& options);
StatusOr<std::shared_ptr<MetadataStore>> OpenEtcdStore(const std::string& host, int port,
                                                       const MetadataOptions& options);

// Standard base64 (RFC 4648, with '=' padding): keys and values travel base64-encoded in the
// JSON of both remote protocols, so they may hold any bytes.
std::string Base64Encode(const std::string& bytes);
// InvalidArgument on a character outside the alphabet or a length that is not a multiple of 4.
StatusOr<std::string> Base64Decode(const std::string& text);

// The answer of a JSON POST: the HTTP status and the parsed body (null when the body is empty).
struct JsonReply {
  int http_status = 0;
  nlohmann::json body;
};

// POSTs `body` as JSON to http://host:port/path with `timeout` for connecting, sending and
// receiving each. Unavailable (naming host:port and path) when the server cannot be reached or
// does not answer in time; Internal when the answer is not JSON. Any HTTP status is returned
// as is: the caller maps it. A `cluster_call` (tandem's own metadata server, not etcd) is
// signed with the cluster token and its answer's proof checked (common/http.h).
StatusOr<JsonReply> PostJson(const std::string& host, int port, const std::string& path,
                             const nlohmann::json& body, std::chrono::milliseconds timeout,
                             bool cluster_call);

}  // namespace tandem::transfer::internal
