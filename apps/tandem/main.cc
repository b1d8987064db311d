// tandem: one binary, one subcommand per role or tool. This file only wires options.
#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "generate_command.h"
#include "serve_command.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM serving with prefill and decode disaggregated"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  CLI::Option* log_level_opt =
      app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (serve: info)");
  tandem::app::GenerateFlags generate;
  CLI::App* generate_cmd = tandem::app::AddGenerateCommand(app, generate);
  tandem::app::ServeFlags serve;
  CLI::App* serve_cmd = tandem::app::AddServeCommand(app, serve);
  CLI11_PARSE(app, argc, argv);
  if (serve_cmd->parsed() && log_level_opt->count() == 0) log_level = "info";
  if (!tandem::SetLogLevel(log_level)) {
    std::fprintf(stderr, "error: unknown log level '%s'\n", log_level.c_str());
    return 2;
  }
  if (generate_cmd->parsed()) return tandem::app::RunGenerate(generate);
  if (serve_cmd->parsed()) return tandem::app::RunServe(serve);
  return 2;
}
