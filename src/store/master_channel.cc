#include <httplib.h>

#include "common/cluster_auth.h"
#include "common/http.h"
#include "common/http_status.h"
#include "common/json_numbers.h"
#include "store/master_channel_internal.h"
#include "store/pool.h"
#include "transfer/metadata.h"

namespace tandem::store::internal {

using json = nlohmann::json;

StatusOr<std::pair<std::string, int>> ParseHttpUri(const std::string& uri) {
  const std::string scheme = "http://";
  if (uri.rfind(scheme, 0) != 0) return InvalidArgument("pool master '" + uri + "' is not http://");
  const std::string rest = uri.substr(scheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("pool master '" + uri + "' has no port");
  int port = 0;
  try {
    port = std::stoi(rest.substr(colon + 1));
  } catch (const std::exception&) {
    return InvalidArgument("pool master '" + uri + "' has a bad port");
  }
  return std::make_pair(rest.substr(0, colon), port);
}

MasterChannel::MasterChannel(std::string master_uri,
                             std::shared_ptr<transfer::MetadataStore> metadata,
                             std::chrono::milliseconds rpc_timeout,
                             std::chrono::milliseconds master_retry)
    : master_uri_(std::move(master_uri)),
      metadata_(std::move(metadata)),
      rpc_timeout_(rpc_timeout),
      master_retry_(master_retry) {}

uint64_t MasterChannel::unavailable() const {
  MutexLock lock(&mu_);
  return unavailable_;
}

void MasterChannel::NoMaster() {
  MutexLock lock(&mu_);
  ++unavailable_;
  no_master_until_ = Clock::now() + master_retry_;
  published_master_.clear();  // looked up again: a new master may be published
}

StatusOr<std::pair<std::string, int>> MasterChannel::Master() {
  if (!master_uri_.empty()) return ParseHttpUri(master_uri_);
  if (!metadata_) return FailedPrecondition("no pool master and no metadata service");
  {
    MutexLock lock(&mu_);
    if (!published_master_.empty()) return ParseHttpUri(published_master_);
  }
  auto uri = metadata_->Get(kMasterKey);
  if (!uri.ok()) return Unavailable("no pool master published: " + uri.status().message());
  auto parsed = ParseHttpUri(*uri);
  if (parsed.ok()) {
    MutexLock lock(&mu_);
    published_master_ = *uri;
  }
  return parsed;
}

StatusOr<json> MasterChannel::Call(const std::string& path, const json& body,
                                   Clock::time_point deadline) {
  return Send("POST", path, body.dump(), deadline);
}

StatusOr<json> MasterChannel::Get(const std::string& path, Clock::time_point deadline) {
  return Send("GET", path, std::string(), deadline);
}

StatusOr<json> MasterChannel::Send(const char* method, const std::string& path,
                                   const std::string& text, Clock::time_point deadline) {
  {
    MutexLock lock(&mu_);
    if (Clock::now() < no_master_until_) {
      ++unavailable_;
      return Unavailable("no pool master answered recently");
    }
  }
  auto master = Master();
  if (!master.ok()) {
    NoMaster();
    return master.status();
  }
  const Clock::time_point until = std::min(deadline, Clock::now() + rpc_timeout_);
  if (until <= Clock::now()) return DeadlineExceeded("pool call " + path + " out of time");
  httplib::Client client(master->first, master->second);
  SetHttpClientDeadline(client, until, rpc_timeout_, rpc_timeout_);
  const ClusterCallHeaders signed_call = SignClusterCall(method, path, text);
  httplib::Result res = std::string(method) == "GET"
                            ? client.Get(path, signed_call.headers)
                            : client.Post(path, signed_call.headers, text, "application/json");
  const std::string peer = "pool master " + master->first + ":" + std::to_string(master->second);
  if (!res) {
    NoMaster();
    return Unavailable(peer + " unreachable: " + httplib::to_string(res.error()));
  }
  TANDEM_RETURN_IF_ERROR(CheckClusterReply(*res, signed_call.nonce, peer));
  json reply = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (!JsonFloatsBounded(reply)) reply = json(json::value_t::discarded);
  if (res->status != 200) {
    if (res->status == 404 || res->status >= 500) {  // not (or no longer) a working master
      MutexLock lock(&mu_);
      published_master_.clear();
    }
    const std::string why =
        reply.is_object() && reply.contains("error") && reply["error"].is_string()
            ? reply["error"].get<std::string>()
            : res->body.substr(0, 200);
    return Status(StatusCodeForHttp(res->status), "pool master " + path + ": " + why);
  }
  if (!reply.is_object()) return Internal("pool master " + path + " answered non-JSON");
  return reply;
}

}  // namespace tandem::store::internal
