// Internal to src/store: the JSON shapes the pool master and its clients exchange
// (master_server.cc lists the protocol).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "store/master_state.h"
#include "store/pool.h"

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

// GET /pool/stats: {capacity, used, objects, segments: [{name, node, capacity, used, objects}],
// counters: {<MasterCounters field>..., journal_failures}}. One field list for both directions.
inline const std::vector<std::pair<const char*, uint64_t MasterCounters::*>>& CounterFields() {
  static const std::vector<std::pair<const char*, uint64_t MasterCounters::*>> fields = {
      {"puts_committed", &MasterCounters::puts_committed},
      {"puts_aborted", &MasterCounters::puts_aborted},
      {"puts_expired", &MasterCounters::puts_expired},
      {"puts_no_space", &MasterCounters::puts_no_space},
      {"puts_existing", &MasterCounters::puts_existing},
      {"get_hits", &MasterCounters::get_hits},
      {"get_misses", &MasterCounters::get_misses},
      {"evictions", &MasterCounters::evictions},
      {"replicas_lost", &MasterCounters::replicas_lost},
      {"objects_lost", &MasterCounters::objects_lost},
      {"removed", &MasterCounters::removed},
      {"hot_replicas", &MasterCounters::hot_replicas},
      {"restored", &MasterCounters::restored}};
  return fields;
}

inline nlohmann::json MasterStatsToJson(const PoolMasterStats& s) {
  nlohmann::json segments = nlohmann::json::array();
  for (const SegmentUsage& u : s.segments) {
    segments.push_back({{"name", u.name},
                        {"node", u.node},
                        {"capacity", u.capacity},
                        {"used", u.used},
                        {"objects", u.objects}});
  }
  nlohmann::json counters = {{"journal_failures", s.journal_failures}};
  for (const auto& [name, field] : CounterFields()) counters[name] = s.counters.*field;
  return {{"capacity", s.capacity},
          {"used", s.used},
          {"objects", s.objects},
          {"segments", std::move(segments)},
          {"counters", std::move(counters)}};
}

// Throws nlohmann::json::exception on a missing or mistyped field; absent counters are 0.
inline PoolMasterStats MasterStatsFromJson(const nlohmann::json& j) {
  PoolMasterStats s;
  s.capacity = j.at("capacity").get<uint64_t>();
  s.used = j.at("used").get<uint64_t>();
  s.objects = j.at("objects").get<uint64_t>();
  for (const auto& seg : j.at("segments")) {
    s.segments.push_back({seg.at("name").get<std::string>(), seg.at("node").get<std::string>(),
                          seg.at("capacity").get<uint64_t>(), seg.at("used").get<uint64_t>(),
                          seg.at("objects").get<int>()});
  }
  const auto& c = j.at("counters");
  for (const auto& [name, field] : CounterFields()) s.counters.*field = c.value(name, uint64_t{0});
  s.journal_failures = c.value("journal_failures", uint64_t{0});
  return s;
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
