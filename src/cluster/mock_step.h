// The step time of a mock worker's engine (`tandem worker --mock PROFILE`): a forward pass
// over a batch costs what the profile's cost model says of the same work, by the formula the
// simulator charges (conductor::CostModel::MixedStepSeconds), so that a cluster of mock workers
// and a simulation of it run on the same engine times.
//
// An item of one token is a decoding sequence (batch + 1, context + start_pos + 1); any other
// is a prompt chunk (n new tokens after start_pos cached). A one-token prompt chunk is therefore
// charged as a decode step's sequence, which costs about the same.
#pragma once

#include <functional>
#include <span>

#include "conductor/policy/cost_model.h"
#include "engine/batch_item.h"

namespace tandem::cluster {

// Seconds of one forward pass over `batch` under `cost`.
double MockStepSeconds(const conductor::CostModel& cost, std::span<const engine::BatchItem> batch);

// The same as a function an engine holds (engine::EngineOptions::mock_step_seconds).
std::function<double(std::span<const engine::BatchItem>)> MockStepFunction(
    conductor::CostModel cost);

}  // namespace tandem::cluster
