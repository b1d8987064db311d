// OpenMetadataStore: parses the store URI and hands off to the backend (metadata_embedded.cc,
// metadata_http_client.cc, metadata_etcd.cc).
#include "transfer/metadata.h"

#include <charconv>

#include "transfer/metadata_internal.h"

namespace tandem::transfer {
namespace {

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port" (optionally with one trailing '/'; IPv6 hosts in brackets: "[::1]:port").
StatusOr<HostPort> ParseHostPort(const std::string& uri, std::string rest) {
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
    return InvalidArgument("metadata URI '" + uri + "' must be of the form scheme://host:port");
  }
  HostPort hp;
  hp.host = rest.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  if (hp.host.empty() || hp.host.find_first_of("/?#@ ") != std::string::npos) {
    return InvalidArgument("metadata URI '" + uri + "' has an invalid host");
  }
  const std::string port = rest.substr(colon + 1);
  const char* end = port.data() + port.size();
  auto [ptr, ec] = std::from_chars(port.data(), end, hp.port);
  if (ec != std::errc() || ptr != end || hp.port < 1 || hp.port > 65535) {
    return InvalidArgument("metadata URI '" + uri + "' has an invalid port '" + port +
                           "' (want 1..65535)");
  }
  return hp;
}

Status CheckOptions(const MetadataOptions& options) {
  if (options.ttl.count() <= 0) return InvalidArgument("metadata ttl must be positive");
  if (options.timeout.count() <= 0) return InvalidArgument("metadata timeout must be positive");
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<MetadataStore>> OpenMetadataStore(const std::string& uri,
                                                           MetadataOptions options) {
  static const std::string kEmbedded = "embedded:";
  static const std::string kHttp = "http://";
  static const std::string kEtcd = "etcd://";
  if (uri.rfind(kEmbedded, 0) == 0) {
    return internal::OpenEmbeddedStore(uri.substr(kEmbedded.size()));
  }
  if (uri.rfind(kHttp, 0) == 0) {
    TANDEM_RETURN_IF_ERROR(CheckOptions(options));
    TANDEM_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(uri, uri.substr(kHttp.size())));
    return internal::OpenHttpStore(hp.host, hp.port, options);
  }
  if (uri.rfind(kEtcd, 0) == 0) {
    TANDEM_RETURN_IF_ERROR(CheckOptions(options));
    TANDEM_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(uri, uri.substr(kEtcd.size())));
    return internal::OpenEtcdStore(hp.host, hp.port, options);
  }
  return InvalidArgument("unknown metadata URI '" + uri +
                         "' (want embedded:<name>, http://host:port or etcd://host:port)");
}

}  // namespace tandem::transfer
