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

// Golden files carry raw bytes as base64 or hex.
inline std::string Base64Decode(const std::string& in) {
  static const std::string kChars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    acc = (acc << 6) | static_cast<uint32_t>(kChars.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

inline std::string HexDecode(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
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
