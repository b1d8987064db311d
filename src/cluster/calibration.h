// A worker's cost model (conductor/policy/cost_model.h), measured on its own engine before it
// serves: prefill of a few prompt lengths with and without a cached prefix, in the chunks the
// serving loop uses, and decode steps of a few batch sizes and contexts. Takes a few seconds
// for a small model; the result is kept in a profile file so that the next start with the same
// model, threads and CPU loads it instead.
#pragma once

#include <string>

#include "common/status.h"
#include "conductor/policy/cost_model.h"
#include "engine/engine.h"

namespace tandem::cluster {

struct CalibrationOptions {
  int max_batch_tokens = 256;  // prefill is timed in chunks of this many tokens, as served
  int repeats = 1;             // each point is timed this often; the fastest run counts
};

// Times the engine's forward passes and fits the model; when the timings do not fit (a busy
// machine), times them again, up to 3 rounds, keeping each point's fastest. Uses (and frees) KV
// blocks of the engine's cache: call before the serving loop owns it. The engine's KV contents
// are overwritten with the synthetic prompts' KV.
StatusOr<conductor::CostModel> Calibrate(engine::Engine& engine, const CalibrationOptions& options);

// Where a saved profile for this engine lives: <dir>/<model>-<bytes>-t<threads>-b<batch>-<cpu>.json
// with dir = $TANDEM_PROFILE_DIR, else $XDG_CACHE_HOME/tandem/profiles, else
// ~/.cache/tandem/profiles. Empty if no directory can be named.
std::string DefaultProfilePath(const engine::Engine& engine, const CalibrationOptions& options);

// `spec`: "auto" (load the default path, or calibrate and save there), "calibrate" (always
// calibrate, save), "none" (an invalid model: no predictions), or a file path to load.
StatusOr<conductor::CostModel> LoadOrCalibrate(engine::Engine& engine, const std::string& spec,
                                               const CalibrationOptions& options);

// The CPU's model name (/proc/cpuinfo), "unknown" if not found.
std::string CpuModelName();

Status WriteProfile(const conductor::CostModel& model, const std::string& path);
StatusOr<conductor::CostModel> ReadProfile(const std::string& path);

}  // namespace tandem::cluster
