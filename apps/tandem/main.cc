// tandem: one binary, one subcommand per role or tool. This file only wires options.
#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "generate_command.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM serving with prefill and decode disaggregated"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off");
  tandem::app::GenerateFlags generate;
  CLI::App* generate_cmd = tandem::app::AddGenerateCommand(app, generate);
  CLI11_PARSE(app, argc, argv);
  if (!tandem::SetLogLevel(log_level)) {
    std::fprintf(stderr, "error: unknown log level '%s'\n", log_level.c_str());
    return 2;
  }
  if (generate_cmd->parsed()) return tandem::app::RunGenerate(generate);
  return 2;
}
