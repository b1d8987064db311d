// Internal to src/store: the JSON shapes the pool master and its clients exchange
// (master_server.cc lists the protocol).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/master_state.h"

namespace tandem::store::internal {

// body["keys"]: an array of strings (throws nlohmann::json::exception otherwise).
inline std::vector<std::string> KeysOf(const nlohmann::json& body) {
  return body.at("keys").get<std::vector<std::string>>();
}

inline nlohmann::json LocationsToJson(const std::vector<Location>& locs) {
  nlohmann::json out = nlohmann::json::array();
  for (const Location& l : locs) {
    out.push_back(
        {{"segment", l.segment}, {"node", l.node}, {"offset", l.offset}, {"size", l.size}});
  }
  return out;
}

inline std::vector<Location> LocationsFromJson(const nlohmann::json& j) {
  std::vector<Location> out;
  for (const auto& l : j) {
    out.push_back({l.at("segment").get<std::string>(), l.at("node").get<std::string>(),
                   l.at("offset").get<uint64_t>(), l.at("size").get<uint64_t>()});
  }
  return out;
}

// A FoundObject: {checksum, verify, replicas, replicate_to?}.
inline nlohmann::json FoundToJson(const FoundObject& f) {
  nlohmann::json out{
      {"checksum", f.checksum}, {"verify", f.verify}, {"replicas", LocationsToJson(f.replicas)}};
  if (f.replicate_to.size > 0) out["replicate_to"] = LocationsToJson({f.replicate_to})[0];
  return out;
}

inline FoundObject FoundFromJson(const nlohmann::json& j) {
  FoundObject f;
  f.checksum = j.at("checksum").get<uint64_t>();
  f.verify = j.value("verify", true);  // absent: verify
  f.replicas = LocationsFromJson(j.at("replicas"));
  if (j.contains("replicate_to")) {
    f.replicate_to = LocationsFromJson(nlohmann::json::array({j.at("replicate_to")}))[0];
  }
  return f;
}

// Durable records (the master's journal in the metadata service).
inline nlohmann::json ObjectRecordToJson(const ObjectRecord& r) {
  return {{"size", r.size}, {"checksum", r.checksum}, {"replicas", LocationsToJson(r.replicas)}};
}
inline ObjectRecord ObjectRecordFromJson(const std::string& key, const nlohmann::json& j) {
  return ObjectRecord{key, j.at("size").get<uint64_t>(), j.at("checksum").get<uint64_t>(),
                      LocationsFromJson(j.at("replicas"))};
}

inline const char* DecisionName(PutDecision d) {
  switch (d) {
    case PutDecision::kReserved: return "reserved";
    case PutDecision::kExists: return "exists";
    case PutDecision::kNoSpace: return "no_space";
  }
  return "no_space";
}

}  // namespace tandem::store::internal
