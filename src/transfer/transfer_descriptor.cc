// The small value types of transfer_engine.h: names of enums and the segment descriptor JSON.
#include <nlohmann/json.hpp>

#include "common/json_numbers.h"
#include "transfer/transfer_engine.h"

namespace tandem::transfer {

const char* ProtocolName(Protocol p) {
  switch (p) {
    case Protocol::kShm: return "shm";
    case Protocol::kTcp: return "tcp";
    case Protocol::kUcx: return "ucx";
  }
  return "unknown";
}

StatusOr<Protocol> ParseProtocol(const std::string& s) {
  if (s == "shm") return Protocol::kShm;
  if (s == "tcp") return Protocol::kTcp;
  if (s == "ucx") return Protocol::kUcx;
  return InvalidArgument("unknown transfer protocol '" + s + "' (expected shm, tcp or ucx)");
}

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kPending: return "pending";
    case TransferState::kCompleted: return "completed";
    case TransferState::kFailed: return "failed";
    case TransferState::kTimedOut: return "timed_out";
  }
  return "unknown";
}

std::string SegmentDescriptor::ToJson() const {
  nlohmann::json j;
  j["name"] = name;
  j["owner"] = owner;
  j["host_id"] = host_id;
  j["size"] = size;
  j["owner_pid"] = owner_pid;
  j["shm_fd"] = shm_fd;
  j["tcp_endpoint"] = tcp_endpoint;
  j["ucx_address"] = ucx_address;
  return j.dump();
}

StatusOr<SegmentDescriptor> SegmentDescriptor::FromJson(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLoss("segment descriptor is not a JSON object");
  }
  if (!JsonFloatsBounded(j)) return DataLoss("segment descriptor: a number is out of range");
  SegmentDescriptor d;
  try {
    d.name = j.at("name").get<std::string>();
    d.owner = j.at("owner").get<std::string>();
    d.host_id = j.value("host_id", std::string());
    d.size = j.at("size").get<uint64_t>();
    d.owner_pid = j.value("owner_pid", 0);
    d.shm_fd = j.value("shm_fd", -1);
    d.tcp_endpoint = j.value("tcp_endpoint", std::string());
    d.ucx_address = j.value("ucx_address", std::string());
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("bad segment descriptor: ") + e.what());
  }
  if (d.name.empty()) return DataLoss("segment descriptor without a name");
  if (d.size == 0) return DataLoss("segment descriptor '" + d.name + "' has size 0");
  return d;
}

}  // namespace tandem::transfer
