// tandem: one binary, one subcommand per role or tool. This file only wires options.
#include <CLI/CLI.hpp>

#include "bench_command.h"
#include "common/logging.h"
#include "generate_command.h"
#include "pool_command.h"
#include "serve_command.h"
#include "simulate_command.h"
#include "transfer_bench_command.h"
#include "worker_command.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM serving with prefill and decode disaggregated"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  CLI::Option* log_level_opt = app.add_option("--log-level", log_level,
                                              "trace, debug, info, warn, error, off (serve: info)");
  tandem::app::GenerateFlags generate;
  CLI::App* generate_cmd = tandem::app::AddGenerateCommand(app, generate);
  tandem::app::ServeFlags serve;
  CLI::App* serve_cmd = tandem::app::AddServeCommand(app, serve);
  tandem::app::ServeFlags conductor;
  CLI::App* conductor_cmd = tandem::app::AddConductorCommand(app, conductor);
  tandem::app::WorkerFlags worker;
  CLI::App* worker_cmd = tandem::app::AddWorkerCommand(app, worker);
  tandem::app::ProfileFlags profile;
  CLI::App* profile_cmd = tandem::app::AddProfileCommand(app, profile);
  tandem::app::BenchFlags bench;
  CLI::App* bench_cmd = tandem::app::AddBenchCommand(app, bench);
  tandem::bench::TransferBenchOptions transfer_bench;
  CLI::App* transfer_bench_cmd = tandem::app::AddTransferBenchCommand(app, transfer_bench);
  tandem::app::SimulateFlags simulate;
  CLI::App* simulate_cmd = tandem::app::AddSimulateCommand(app, simulate);
  tandem::app::PoolMasterFlags pool_master;
  CLI::App* pool_master_cmd = tandem::app::AddPoolMasterCommand(app, pool_master);
  tandem::app::StoreFlags store;
  CLI::App* store_cmd = tandem::app::AddStoreCommand(app, store);
  tandem::app::PoolBenchFlags pool_bench;
  CLI::App* pool_bench_cmd = tandem::app::AddPoolBenchCommand(app, pool_bench);
  CLI11_PARSE(app, argc, argv);
  if ((serve_cmd->parsed() || worker_cmd->parsed() || conductor_cmd->parsed() ||
       pool_master_cmd->parsed() || store_cmd->parsed()) &&
      log_level_opt->count() == 0) {
    log_level = "info";
  }
  if (!tandem::SetLogLevel(log_level)) {
    std::fprintf(stderr, "error: unknown log level '%s'\n", log_level.c_str());
    return 2;
  }
  if (generate_cmd->parsed()) return tandem::app::RunGenerate(generate);
  if (serve_cmd->parsed()) return tandem::app::RunServe(serve);
  if (worker_cmd->parsed()) return tandem::app::RunWorker(worker);
  if (conductor_cmd->parsed()) return tandem::app::RunServe(conductor);
  if (profile_cmd->parsed()) return tandem::app::RunProfile(profile);
  if (bench_cmd->parsed()) return tandem::app::RunBench(bench);
  if (simulate_cmd->parsed()) return tandem::app::RunSimulate(simulate);
  if (pool_master_cmd->parsed()) return tandem::app::RunPoolMaster(pool_master);
  if (store_cmd->parsed()) return tandem::app::RunStore(store);
  if (pool_bench_cmd->parsed()) return tandem::app::RunPoolBench(pool_bench);
  if (transfer_bench_cmd->parsed()) return tandem::bench::RunTransferBench(transfer_bench);
  return 2;
}
