// `tandem transfer-bench`: the flags of bench/transfer_bench.h (which holds the benchmark).
#pragma once

#include <CLI/CLI.hpp>

#include "bench/transfer_bench.h"

namespace tandem::app {

// Registers the subcommand and its flags on `app`; `options` must outlive parsing. Run it with
// bench::RunTransferBench.
CLI::App* AddTransferBenchCommand(CLI::App& app, bench::TransferBenchOptions& options);

}  // namespace tandem::app
