// Small pieces of the HTTP front door kept apart from the server for testing: status and error
// mappings and bearer-token comparison.
#pragma once

#include <string>

#include "common/status.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "serving/backend.h"

namespace tandem::server {

Outcome OutcomeOf(serving::FinishReason r);

// The error a request that did not end in stop/length reports: 504 (timeout), 503 (cancelled,
// i.e. shut down), 500 (error). timeout_s: the request timeout, named in the message.
ApiError FailureError(const serving::FinishInfo& info, double timeout_s);

// Maps a refused GenerationBackend::Submit to an HTTP error and the outcome to count:
// ResourceExhausted 429, FailedPrecondition/Unavailable 503 (rejected), InvalidArgument/
// OutOfRange 400 (bad_request), anything else 500 (error).
ApiError SubmitError(const Status& st, Outcome* outcome);

// Compares in time independent of where the strings differ (API keys).
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace tandem::server
