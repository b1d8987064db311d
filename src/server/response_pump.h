// Moves one response's output from its ChoiceSet to its HTTP exchange as the output arrives,
// without a thread: the request's sinks ring the set's doorbell (on a backend thread), the ring
// schedules a step on the exchange's event-loop strand, and a step takes what is new and sends
// it (SSE events, or the whole body once every choice finished). A timer ends a response the
// backend never finished at `give_up`.
//
// A stream is paced by its client: no step runs while more than kMaxBacklogBytes wait to be
// written (text accumulates in the sinks instead); the exchange's OnWritable resumes it.
// When the client goes away, the choices are cancelled.
//
// Lifetime: the exchange holds the pump (and `keep`) until its answer is written or abandoned;
// the doorbell and the exchange's callbacks hold it weakly.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "http_door/door.h"
#include "server/choices.h"

namespace tandem::server {

struct PumpOptions {
  bool stream = false;
  double timeout_s = 600;  // the request timeout, named in timeout errors
  std::chrono::steady_clock::time_point give_up;
  // Added to the answer (CORS grants).
  std::vector<std::pair<std::string, std::string>> headers;
  // n > 1: given the forks ChoiceSet::TakeDueForks found due at a step, it must have them
  // submitted off the event loop (ChoiceSet::SubmitForks on another thread). Null: n == 1.
  std::function<void(std::vector<size_t>)> submit_forks;
};

// Starts answering `exchange` from `choices` (their first choices submitted).
void StartResponsePump(std::shared_ptr<ChoiceSet> choices,
                       std::shared_ptr<http_door::Exchange> exchange, PumpOptions options,
                       std::shared_ptr<void> keep);

}  // namespace tandem::server
