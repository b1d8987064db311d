// The one mapping from a Status to an HTTP status code (and back, StatusCodeForHttp), used by every
// HTTP endpoint of tandem (the OpenAI front door and the worker's control protocol) so that a code
// means the same everywhere: 400 bad input, 404 unknown, 429 no capacity now (retry), 503
// unavailable or shutting down, 504 out of time, 501 unsupported, 500 the rest.
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
    case StatusCode::kUnauthenticated: return 401;
  }
  return 500;
}

// The other way, for clients of tandem's own HTTP services: the code whose HttpStatusFor is
// `http_status` (the canonical one where several share it: 503 is kUnavailable), kOk for 2xx,
// kInternal for anything the mapping never produces.
inline StatusCode StatusCodeForHttp(int http_status) {
  if (http_status >= 200 && http_status < 300) return StatusCode::kOk;
  switch (http_status) {
    case 400: return StatusCode::kInvalidArgument;
    case 401: return StatusCode::kUnauthenticated;
    case 404: return StatusCode::kNotFound;
    case 429: return StatusCode::kResourceExhausted;
    case 501: return StatusCode::kUnimplemented;
    case 503: return StatusCode::kUnavailable;
    case 504: return StatusCode::kDeadlineExceeded;
    default: return StatusCode::kInternal;
  }
}

}  // namespace tandem
