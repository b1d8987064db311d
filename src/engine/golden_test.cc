// Agreement with llama.cpp on the default model: prompts, chat rendering, tokenization,
// first-step logits and greedy generations recorded by tools/golden/make_generation_golden.py
// (see tests/golden/smollm2/README.md for how the data was made).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace tandem::engine {
namespace {

// The quantized forward pass is sensitive to float summation order: activations are rounded to
// 8 bits before every matrix multiply, so a last-bit change flips some roundings and the effect
// grows through 30 layers. Measured on this model: changing only the attention's summation order
// inside tandem moves first-step logits by 0.09 on average and 0.46 at most; tandem against
// llama.cpp differs by about the same. The tolerances below sit above that noise floor.
//
// A greedy step whose llama.cpp top-1/top-2 margin is below kNoiseMargin may legitimately flip.
constexpr double kNoiseMargin = 0.5;
// First-step logits over the whole vocabulary, each side centred on its mean.
constexpr double kMeanAbsLogitTolerance = 0.2;
constexpr float kMaxAbsLogitTolerance = 1.5f;

std::string SourceDir() {
  const char* s = std::getenv("TANDEM_SOURCE_DIR");
  return s ? s : ".";
}

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

class GoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = SourceDir() + "/tests/golden/smollm2";
    std::ifstream in(dir + "/cases.json");
    ASSERT_TRUE(in.good()) << "missing " << dir << "/cases.json";
    golden_ = new nlohmann::json(nlohmann::json::parse(in));
    EngineOptions opts;
    opts.model_path = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    opts.threads = 2;
    opts.kv_capacity_tokens = 4096;
    auto e = Engine::Load(opts);
    ASSERT_TRUE(e.ok()) << e.status().ToString() << " (run scripts/setup.sh to fetch the model)";
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete golden_;
  }
  static Engine* engine_;
  static nlohmann::json* golden_;
};
Engine* GoldenTest::engine_ = nullptr;
nlohmann::json* GoldenTest::golden_ = nullptr;

TEST_F(GoldenTest, ChatRenderingAndTokenizationMatch) {
  ASSERT_NE(engine_->chat_template(), nullptr) << engine_->chat_template_error();
  int cases = 0;
  for (const auto& c : (*golden_)["cases"]) {
    const std::string prompt = c["prompt"];
    const bool chat = c["kind"] == "chat";
    if (chat) {
      std::vector<model::ChatMessage> messages;
      for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
      auto rendered = engine_->chat_template()->Apply(messages, true);
      ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
      EXPECT_EQ(*rendered, prompt) << c["name"];
    }
    const auto ids = engine_->tokenizer().Encode(prompt, false, /*parse_special=*/chat);
    EXPECT_EQ(ids, c["prompt_tokens"].get<std::vector<int32_t>>()) << c["name"];
    ++cases;
  }
  EXPECT_GE(cases, 20);
}

TEST_F(GoldenTest, FirstStepLogitsAgree) {
  const std::string dir = SourceDir() + "/tests/golden/smollm2/";
  double worst_mean = 0;
  for (const auto& c : (*golden_)["cases"]) {
    const std::string name = c["name"];
    GenerateOptions opts;
    opts.max_tokens = 1;
    auto got = engine_->Generate(c["prompt_tokens"].get<std::vector<int32_t>>(), opts, nullptr);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    const auto ref = ReadF32(dir + c["logits_file"].get<std::string>());
    ASSERT_EQ(ref.size(), got->first_logits.size()) << name;
    // Logits are compared after removing each side's mean: a constant shift changes no
    // probability (softmax is shift-invariant) and is a large part of the raw difference.
    double mean_ref = 0, mean_got = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      mean_ref += ref[i];
      mean_got += got->first_logits[i];
    }
    mean_ref /= ref.size();
    mean_got /= ref.size();
    double sum = 0;
    float max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float d =
          static_cast<float>(std::fabs((ref[i] - mean_ref) - (got->first_logits[i] - mean_got)));
      sum += d;
      max_diff = std::max(max_diff, d);
    }
    const double mean = sum / ref.size();
    worst_mean = std::max(worst_mean, mean);
    EXPECT_LE(mean, kMeanAbsLogitTolerance) << name;
    EXPECT_LE(max_diff, kMaxAbsLogitTolerance) << name;
    if (c["margins"][0].get<double>() >= kNoiseMargin) {
      EXPECT_EQ(Argmax(got->first_logits), c["output_tokens"][0].get<int32_t>()) << name;
    }
  }
  std::printf("[ golden   ] worst mean |centred logit difference| over cases: %.4f\n", worst_mean);
}

// Teacher forcing: feed llama.cpp's own tokens and check our greedy choice at every step. Where
// llama.cpp's margin is above the noise floor, the choice must be the same.
TEST_F(GoldenTest, TeacherForcedGreedyChoicesAgree) {
  int steps = 0, agree = 0, confident = 0;
  std::vector<float> logits;
  for (const auto& c : (*golden_)["cases"]) {
    const std::string name = c["name"];
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    const auto want = c["output_tokens"].get<std::vector<int32_t>>();
    const auto margins = c["margins"].get<std::vector<double>>();
    PagedKvCache& kv = engine_->kv();
    auto blocks = kv.Allocate(kv.BlocksFor(prompt.size() + want.size()));
    ASSERT_TRUE(blocks.ok());
    BatchItem item{*blocks, 0, prompt, true};
    ASSERT_TRUE(engine_->transformer().Forward({&item, 1}, kv, &logits).ok());
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t ours = Argmax(logits);
      ++steps;
      agree += ours == want[i];
      if (margins[i] >= kNoiseMargin) {
        ++confident;
        EXPECT_EQ(ours, want[i]) << name << " step " << i << " (llama.cpp margin " << margins[i]
                                 << ")";
      }
      if (i + 1 == want.size()) break;
      BatchItem next{*blocks, static_cast<int>(prompt.size() + i), {&want[i], 1}, true};
      ASSERT_TRUE(engine_->transformer().Forward({&next, 1}, kv, &logits).ok());
    }
    kv.Release(*blocks);
  }
  std::printf(
      "[ golden   ] teacher-forced: %d/%d steps agree; all %d steps above the noise margin "
      "checked\n",
      agree, steps, confident);
  // Below the noise margin a step is a near-tie and agreement there is close to a coin flip:
  // measured 1047/1074 with fp32 queries and 1034/1074 (96.3%) with queries rounded to fp16 as
  // llama.cpp rounds them, with every step above the margin agreeing both times. The floor only
  // catches a wholesale drift.
  EXPECT_GE(agree, steps * 95 / 100);
}

// Free-running greedy generation: identical to llama.cpp until a step where llama.cpp itself was
// within the noise margin (after which the two texts may legitimately differ).
TEST_F(GoldenTest, FreeRunningGreedyGenerationAgrees) {
  int exact = 0, total = 0;
  for (const auto& c : (*golden_)["cases"]) {
    const std::string name = c["name"];
    const auto want = c["output_tokens"].get<std::vector<int32_t>>();
    const auto margins = c["margins"].get<std::vector<double>>();
    GenerateOptions opts;
    opts.max_tokens = static_cast<int>(want.size());
    auto got = engine_->Generate(c["prompt_tokens"].get<std::vector<int32_t>>(), opts, nullptr);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    ++total;
    size_t i = 0;
    while (i < want.size() && i < got->tokens.size() && want[i] == got->tokens[i]) ++i;
    if (i == want.size() && got->tokens.size() == want.size()) {
      ++exact;
      continue;
    }
    ASSERT_LT(i, margins.size()) << name;
    EXPECT_LT(margins[i], kNoiseMargin)
        << name << ": diverged at step " << i << " (llama.cpp margin " << margins[i] << ")";
    std::printf(
        "[ golden   ] %s: same first %zu tokens, diverges where llama.cpp's margin is %.4f\n",
        name.c_str(), i, margins[i]);
  }
  std::printf("[ golden   ] %d/%d cases identical for every token\n", exact, total);
  EXPECT_GE(total, 20);
}

}  // namespace
}  // namespace tandem::engine
