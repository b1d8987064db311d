#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "common/http_status.h"
#include "common/json_numbers.h"
#include "store/master_calls_internal.h"
#include "store/pool_protocol_internal.h"

namespace tandem::store::internal {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Handler = std::function<StatusOr<json>(MasterState&, const json&, Clock::time_point)>;

StatusOr<json> Mount(MasterState& state, const json& b, Clock::time_point now) {
  const int64_t ttl_ms = b.at("ttl_ms").get<int64_t>();
  const int64_t capacity = b.at("capacity").get<int64_t>();
  if (ttl_ms <= 0 || ttl_ms > 600000) return InvalidArgument("ttl_ms not in 1..600000");
  if (capacity <= 0) return InvalidArgument("capacity must be positive");
  TANDEM_RETURN_IF_ERROR(state.Mount(b.at("segment").get<std::string>(),
                                     b.at("node").get<std::string>(),
                                     static_cast<uint64_t>(capacity), now + milliseconds(ttl_ms)));
  return json::object();
}

StatusOr<json> PutStart(MasterState& state, const json& b, Clock::time_point now) {
  const auto keys = KeysOf(b);
  const int64_t size = b.at("size").get<int64_t>();
  const int replicas = b.at("replicas").get<int>();
  const int64_t ttl_ms = b.at("ttl_ms").get<int64_t>();
  if (size <= 0) return InvalidArgument("size must be positive");
  if (replicas < 1 || replicas > 16) return InvalidArgument("replicas not in 1..16");
  if (ttl_ms <= 0 || ttl_ms > 600000) return InvalidArgument("ttl_ms not in 1..600000");
  json results = json::array();
  for (const PutReservation& r :
       state.PutStart(keys, static_cast<uint64_t>(size), replicas, b.at("node").get<std::string>(),
                      now, now + milliseconds(ttl_ms))) {
    results.push_back(
        {{"decision", DecisionName(r.decision)}, {"locations", LocationsToJson(r.locations)}});
  }
  return json{{"results", std::move(results)}};
}

StatusOr<json> PutEnd(MasterState& state, const json& b, Clock::time_point) {
  const auto keys = KeysOf(b);
  const auto ok = b.at("ok").get<std::vector<bool>>();
  const auto checksums = b.at("checksums").get<std::vector<uint64_t>>();
  if (ok.size() != keys.size() || checksums.size() != keys.size()) {
    return InvalidArgument("keys, ok and checksums differ in length");
  }
  state.PutEnd(keys, ok, checksums);
  return json::object();
}

StatusOr<json> Get(MasterState& state, const json& b, Clock::time_point now) {
  const auto keys = KeysOf(b);
  const int64_t lease_ms = b.at("lease_ms").get<int64_t>();
  if (lease_ms < 0 || lease_ms > 600000) return InvalidArgument("lease_ms not in 0..600000");
  json objects = json::array();
  for (const FoundObject& f : state.GetPrefix(keys, now, now + milliseconds(lease_ms))) {
    objects.push_back(FoundToJson(f));
  }
  return json{{"objects", std::move(objects)}};
}

const std::map<std::string, Handler>& Handlers() {
  static const auto* handlers = new std::map<std::string, Handler>{
      {"/pool/mount", Mount},
      {"/pool/unmount",
       [](MasterState& s, const json& b, Clock::time_point) -> StatusOr<json> {
         s.Unmount(b.at("segment").get<std::string>());
         return json::object();
       }},
      {"/pool/put_start", PutStart},
      {"/pool/put_end", PutEnd},
      {"/pool/replica_end",
       [](MasterState& s, const json& b, Clock::time_point) -> StatusOr<json> {
         s.ReplicaEnd(b.at("key").get<std::string>(), b.at("segment").get<std::string>(),
                      b.at("ok").get<bool>());
         return json::object();
       }},
      {"/pool/get", Get},
      {"/pool/exist",
       [](MasterState& s, const json& b, Clock::time_point) -> StatusOr<json> {
         return json{{"exist", s.Exist(KeysOf(b))}};
       }},
      {"/pool/remove",
       [](MasterState& s, const json& b, Clock::time_point now) -> StatusOr<json> {
         return json{{"removed", s.Remove(KeysOf(b), now)}};
       }},
      {"/pool/bad_replica",
       [](MasterState& s, const json& b, Clock::time_point) -> StatusOr<json> {
         s.ReportBadReplica(b.at("key").get<std::string>(), b.at("segment").get<std::string>());
         return json::object();
       }},
  };
  return *handlers;
}

}  // namespace

std::vector<std::string> MasterCallPaths() {
  std::vector<std::string> paths;
  for (const auto& [path, handler] : Handlers()) paths.push_back(path);
  return paths;
}

MasterReply MasterCall(MasterState& state, const std::string& path, const std::string& text,
                       Clock::time_point now) {
  StatusOr<json> reply = NotFound("no such pool master call: " + path);
  auto handler = Handlers().find(path);
  if (handler != Handlers().end()) {
    const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
    reply = InvalidArgument("request body must be a JSON object");
    if (body.is_object() && !JsonFloatsBounded(body)) {
      reply = InvalidArgument("request body: a number is out of range");
    } else if (body.is_object()) {
      try {
        reply = handler->second(state, body, now);
      } catch (const json::exception& e) {  // a field missing or of the wrong type
        reply = InvalidArgument(std::string("bad request: ") + e.what());
      }
    }
  }
  const json out = reply.ok() ? *reply : json{{"error", reply.status().message()}};
  // Error texts may quote the caller's bytes: ill-formed UTF-8 is replaced, never a throw.
  return {HttpStatusFor(reply.status().code()),
          out.dump(-1, ' ', false, json::error_handler_t::replace)};
}

}  // namespace tandem::store::internal
