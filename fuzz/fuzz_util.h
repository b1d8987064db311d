// Shared by the libFuzzer harnesses: the models of the source tree, loaded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/text_front_end.h"

namespace tandem::fuzz {

// models/<file> of the source tree (TANDEM_SOURCE_DIR, set by fuzz/CMakeLists.txt), or of
// $TANDEM_SOURCE_DIR when set.
inline std::string ModelPath(const std::string& file) {
  const char* env = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(env != nullptr ? env : TANDEM_SOURCE_DIR) + "/models/" + file;
}

// The tokenizer and chat template of a model file; aborts when it cannot be read, since a
// harness without them would fuzz less than it claims (scripts/setup.sh fetches both models).
inline model::TextFrontEnd LoadFrontEnd(const std::string& file) {
  const std::string path = ModelPath(file);
  auto gguf = model::GgufFile::Open(path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "fuzz: cannot open %s: %s\n", path.c_str(),
                 gguf.status().ToString().c_str());
    std::abort();
  }
  auto config = model::ReadModelConfig(**gguf);
  auto front = config.ok() ? model::LoadTextFrontEnd(**gguf, *config)
                           : StatusOr<model::TextFrontEnd>(config.status());
  if (!front.ok()) {
    std::fprintf(stderr, "fuzz: cannot load the tokenizer of %s: %s\n", path.c_str(),
                 front.status().ToString().c_str());
    std::abort();
  }
  return std::move(*front);
}

// Reports a broken property and stops the run (libFuzzer saves the input as a crash).
#define TANDEM_FUZZ_CHECK(cond)                                                                \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

// Calls f(line) for each non-empty '\n'-separated line of the input, at most max_lines of
// them (the harnesses that replay a session of calls).
template <typename F>
void ForEachLine(const uint8_t* data, size_t size, int max_lines, F f) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  for (int lines = 0; !input.empty() && lines < max_lines; ++lines) {
    const size_t eol = input.find('\n');
    const std::string_view line = input.substr(0, eol);
    input = eol == std::string_view::npos ? std::string_view() : input.substr(eol + 1);
    if (!line.empty()) f(line);
  }
}

}  // namespace tandem::fuzz
