// The JSON documents cluster processes exchange: the worker control protocol (calls, results,
// the streamed /v1/decode lines, membership and stats records, errors) and the transfer
// engine's segment descriptors from the metadata service.
// Input: byte 0 picks the document type; the rest is its text.
// Properties: no crash or sanitizer report; whatever parses serializes to a document that
// parses again to the same serialization (what one process writes, the other reads back).
#include <cstddef>
#include <cstdint>
#include <string>

#include "cluster/protocol.h"
#include "fuzz/fuzz_util.h"
#include "transfer/transfer_engine.h"

namespace {

using namespace tandem;

template <typename T>
void RoundTrip(const std::string& text) {
  StatusOr<T> parsed = T::FromJson(text);
  if (!parsed.ok()) {
    TANDEM_FUZZ_CHECK(!parsed.status().message().empty());
    return;
  }
  const std::string once = parsed->ToJson();
  StatusOr<T> again = T::FromJson(once);
  TANDEM_FUZZ_CHECK(again.ok());
  TANDEM_FUZZ_CHECK(again->ToJson() == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 11) {
    case 0: RoundTrip<cluster::WorkerInfo>(text); break;
    case 1: RoundTrip<cluster::WorkerStats>(text); break;
    case 2: RoundTrip<cluster::DecodeCall>(text); break;
    case 3: RoundTrip<cluster::PrefillCall>(text); break;
    case 4: RoundTrip<cluster::PrefillResult>(text); break;
    case 5: RoundTrip<cluster::DecodeEvent>(text); break;
    case 6: RoundTrip<cluster::RoleChange>(text); break;
    case 7: RoundTrip<cluster::RoleChangeResult>(text); break;
    case 8: RoundTrip<transfer::SegmentDescriptor>(text); break;
    case 9: RoundTrip<conductor::CostModel>(text); break;
    default: {
      const Status st = cluster::StatusFromErrorJson(text, "fallback");
      TANDEM_FUZZ_CHECK(!st.ok());
      // An error read back from its own JSON keeps its code and message.
      const Status again = cluster::StatusFromErrorJson(cluster::ErrorJson(st), "other");
      TANDEM_FUZZ_CHECK(again.code() == st.code() && again.message() == st.message());
    }
  }
  return 0;
}
