// Test-only helpers shared by tokenizer_test.cc and chat_template_test.cc: locating and
// reading tests/golden/tokenizer/ files (see its README.md).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/tokenizer.h"

namespace tandem::model::testing_util {

// $TANDEM_SOURCE_DIR/tests/golden/tokenizer when set (CTest sets it), else found relative to
// this source file or by walking up from the working directory.
inline std::filesystem::path GoldenDir() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("tests") / "golden" / "tokenizer";
  if (const char* src = std::getenv("TANDEM_SOURCE_DIR")) return fs::path(src) / rel;
  const fs::path from_file = fs::path(__FILE__).parent_path() / ".." / ".." / rel;
  if (fs::exists(from_file)) return from_file;
  for (fs::path p = fs::current_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p / rel)) return p / rel;
    if (p == p.parent_path()) break;
  }
  return rel;
}

inline nlohmann::json ReadGoldenJson(const std::string& name) {
  const std::filesystem::path path = GoldenDir() / name;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open golden file " << path;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(in);
}

// The SmolLM2-135M-Instruct tokenizer metadata (tests/golden/tokenizer/smollm2_vocab.json).
inline const nlohmann::json& SmolLm2VocabJson() {
  static const nlohmann::json j = ReadGoldenJson("smollm2_vocab.json");
  return j;
}

inline VocabData SmolLm2Vocab() {
  const nlohmann::json& j = SmolLm2VocabJson();
  VocabData v;
  if (!j.contains("tokens")) return v;
  v.model = j["model"];
  v.pre = j["pre"];
  v.tokens = j["tokens"].get<std::vector<std::string>>();
  v.token_types = j["token_types"].get<std::vector<int32_t>>();
  v.merges = j["merges"].get<std::vector<std::string>>();
  v.bos_id = j["bos_id"];
  v.eos_id = j["eos_id"];
  v.unk_id = j["unk_id"];
  v.pad_id = j["pad_id"];
  v.add_bos = j["add_bos"];
  v.add_eos = j["add_eos"];
  return v;
}

}  // namespace tandem::model::testing_util
