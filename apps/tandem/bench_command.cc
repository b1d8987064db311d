#include "bench_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#ifndef TANDEM_SOURCE_DIR
#define TANDEM_SOURCE_DIR "."
#endif

namespace tandem::app {
namespace {

// The first executable `name` on PATH, or "" if there is none.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
    start = end + 1;
  }
  return "";
}

}  // namespace

std::string BenchServeScriptPath() {
  const char* env = std::getenv("TANDEM_BENCH_SCRIPT");
  if (env != nullptr && *env != '\0') return env;
  return std::string(TANDEM_SOURCE_DIR) + "/bench/serving/serve_bench.py";
}

CLI::App* AddBenchCommand(CLI::App& app, BenchFlags& f) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks (serve: load generator for OpenAI-compatible servers)");
  bench->require_subcommand(1);
  f.serve = bench->add_subcommand(
      "serve",
      "Replay a trace or a synthetic workload against an OpenAI-compatible server; all arguments "
      "go to bench/serving/serve_bench.py (see `tandem bench serve --help`)");
  // Everything after `serve`, --help included, belongs to the script.
  f.serve->prefix_command();
  f.serve->allow_extras();
  f.serve->set_help_flag();
  return bench;
}

int RunBench(const BenchFlags& f) {
  if (f.serve == nullptr || !f.serve->parsed()) {
    std::fprintf(stderr, "error: `tandem bench` needs a benchmark: serve\n");
    return 2;
  }
  const std::string script = BenchServeScriptPath();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(script, ec)) {
    std::fprintf(stderr,
                 "error: benchmark script not found: %s (set TANDEM_BENCH_SCRIPT to "
                 "bench/serving/serve_bench.py of a tandem source tree)\n",
                 script.c_str());
    return 2;
  }
  const std::string python = FindOnPath("python3");
  if (python.empty()) {
    std::fprintf(stderr, "error: python3 not found on PATH; `tandem bench serve` runs %s with it\n",
                 script.c_str());
    return 2;
  }
  const std::vector<std::string> extras = f.serve->remaining();
  std::vector<std::string> args;
  args.reserve(extras.size() + 2);
  args.push_back(python);
  args.push_back(script);
  args.insert(args.end(), extras.begin(), extras.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execv(python.c_str(), argv.data());
  std::fprintf(stderr, "error: could not run %s: %s\n", python.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace tandem::app
