// Private to tandem_metadata: the paths of the HTTP metadata protocol, shared by the server
// (metadata_http_server.cc, where the protocol is described) and the client.
#pragma once

namespace tandem::transfer::internal::http_protocol {

inline constexpr char kLeaseGrant[] = "/v1/lease/grant";
inline constexpr char kLeaseKeepAlive[] = "/v1/lease/keepalive";
inline constexpr char kLeaseRevoke[] = "/v1/lease/revoke";
inline constexpr char kPut[] = "/v1/kv/put";
inline constexpr char kGet[] = "/v1/kv/get";
inline constexpr char kDelete[] = "/v1/kv/delete";
inline constexpr char kList[] = "/v1/kv/list";
inline constexpr char kHealth[] = "/v1/health";

// Largest lease TTL the server grants, in milliseconds (one day).
inline constexpr long long kMaxTtlMs = 24LL * 3600 * 1000;

}  // namespace tandem::transfer::internal::http_protocol
