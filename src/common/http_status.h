// The one mapping from a Status to an HTTP status code, used by every HTTP endpoint of tandem
// (the OpenAI front door and the worker's control protocol) so that a code means the same
// everywhere: 400 bad input, 404 unknown, 429 no capacity now (retry), 503 unavailable or
// shutting down, 504 out of time, 501 unsupported, 500 the rest.
#pragma once

#include "common/status.h"

namespace tandem {

inline int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

}  // namespace tandem
