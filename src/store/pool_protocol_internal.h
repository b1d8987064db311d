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

inline const char* DecisionName(PutDecision d) {
  switch (d) {
    case PutDecision::kReserved: return "reserved";
    case PutDecision::kExists: return "exists";
    case PutDecision::kNoSpace: return "no_space";
  }
  return "no_space";
}

}  // namespace tandem::store::internal
