// Small helpers every `tandem` subcommand uses.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "conductor/policy/cost_model.h"
#include "engine/memory_plan.h"
#include "flags.h"
#include "model/model_config.h"

namespace tandem::app {

// The bundled model: models/SmolLM2-135M-Instruct.Q4_1.gguf next to the binary's source tree
// (build/tandem -> models/), else relative to the working directory.
std::string DefaultModelPath();
// Blocks SIGINT and SIGTERM in this thread (call before starting threads, so that only sigwait
// takes them) and ignores SIGPIPE; returns the blocked set.
sigset_t BlockTerminationSignals();
// The machine's hardware threads (at least 1).
int DefaultThreads();

// Installs the process's cluster token (common/cluster_auth.h) from `file`, else from
// $TANDEM_CLUSTER_TOKEN, else (with `generate`) a random one, exported in that variable for
// the processes this one starts. Prints the error and returns false when the token is bad.
bool SetUpClusterToken(const std::string& file, bool generate);

// The memory plan's inputs (engine/memory_plan.h) of an engine process with these knobs and
// threads whose KV cache holds kv_tokens positions; `lends_pool`: a worker that mounts
// --pool-dram-mb for the KV pool.
engine::MemoryPlanInputs PlanInputs(int64_t model_file_bytes, const model::ModelConfig& config,
                                    const WorkerKnobs& knobs, int threads, int64_t kv_tokens,
                                    bool lends_pool);

// The KV positions (whole blocks) an engine process of --memory-budget-mb can hold after the
// rest of its plan (`in`, whose KV size is ignored); an error naming the plan when that is not
// even one block.
StatusOr<int64_t> KvTokensInBudget(int budget_mb, const model::ModelConfig& config,
                                   const engine::MemoryPlanInputs& in);

// --mock PROFILE (sim/profile.h): the profile's cost model (source "mock:PROFILE"), after
// writing its instance settings over the knobs (block tokens, max batch tokens, max sequences
// when the profile limits them) and *kv_cache_tokens (when the profile states a capacity).
StatusOr<conductor::CostModel> ApplyMockProfile(const std::string& path, WorkerKnobs* knobs,
                                                int64_t* kv_cache_tokens);

}  // namespace tandem::app
