// `tandem bench serve ARGS...`: runs the serving benchmark (bench/serving/serve_bench.py) with
// python3, passing every argument after `serve` through unchanged.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tandem::app {

struct BenchFlags {
  CLI::App* serve = nullptr;  // the `bench serve` subcommand; its remaining() are the script's args
};

// Registers `bench` and its `serve` subcommand on `app`; the flags object must outlive parsing.
CLI::App* AddBenchCommand(CLI::App& app, BenchFlags& flags);

// Replaces the process with python3 running the script (returns only on error, with an exit code).
int RunBench(const BenchFlags& flags);

// The script run by `bench serve`: env TANDEM_BENCH_SCRIPT if set, else the one in the source tree.
std::string BenchServeScriptPath();

}  // namespace tandem::app
