// `tandem generate`: one prompt in, generated text out (stdout), timings on stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace tandem::app {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  int max_tokens = 64;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool chat = false;
  bool ignore_eos = false;
  int threads = 0;  // 0: all cores
};

// Registers the subcommand and its flags on `app`; the flags object must outlive parsing.
CLI::App* AddGenerateCommand(CLI::App& app, GenerateFlags& flags);
int RunGenerate(const GenerateFlags& flags);

}  // namespace tandem::app
