#include "serving/backend.h"

namespace tandem::serving {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kTimeout: return "timeout";
  }
  return "unknown";
}

}  // namespace tandem::serving
