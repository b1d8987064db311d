#include "cluster/calibration.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tandem::cluster {
namespace {

class CalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The bundled model: calibration needs a whole engine (tokenizer included).
    const char* src = std::getenv("TANDEM_SOURCE_DIR");
    engine::EngineOptions o;
    o.model_path = std::string(src ? src : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    o.kv_capacity_tokens = 2048;
    auto e = engine::Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-profiles-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    ::setenv("TANDEM_PROFILE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    engine_.reset();
    std::filesystem::remove_all(dir_);
    ::unsetenv("TANDEM_PROFILE_DIR");
  }
  std::filesystem::path dir_;
  std::unique_ptr<engine::Engine> engine_;
};

TEST_F(CalibrationTest, MeasuresAModelThatGrowsWithTheWork) {
  const int free_before = engine_->kv().num_free();
  auto m = Calibrate(*engine_, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->valid());
  EXPECT_EQ(engine_->kv().num_free(), free_before);  // every block it used is back
  EXPECT_EQ(m->source, "calibrated");
  EXPECT_EQ(m->threads, 1);
  EXPECT_LT(m->PrefillSeconds(16, 0), m->PrefillSeconds(512, 0));
  EXPECT_LE(m->DecodeStepSeconds(1, 64), m->DecodeStepSeconds(16, 8192));
}

// Gemma 3's sliding layers keep KV in a window arena: calibration lends it and takes it back.
TEST(CalibrationWindowTest, MeasuresASlidingWindowModel) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  engine::EngineOptions o;
  o.model_path = std::string(src ? src : ".") + "/models/gemma-3-270m-q4_k_m.gguf";
  o.kv_capacity_tokens = 8192;
  o.max_sequences = 8;  // a window arena smaller than the cache, as a worker sizes it
  o.max_step_tokens = 256;
  auto e = engine::Engine::Load(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const auto& kv = (*e)->kv();
  ASSERT_LT(kv.num_window_blocks(), kv.num_blocks());
  auto m = Calibrate(**e, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->valid());
  EXPECT_EQ(kv.num_free(), kv.num_blocks());
  EXPECT_EQ(kv.num_free_window(), kv.num_window_blocks());
}

TEST_F(CalibrationTest, AutoSavesTheProfileAndLoadsItNextTime) {
  const std::string saved = DefaultProfilePath(*engine_, {});
  ASSERT_EQ(saved.rfind(dir_.string(), 0), 0u) << saved;
  auto first = LoadOrCalibrate(*engine_, "auto", {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->source, "calibrated");
  ASSERT_TRUE(std::filesystem::exists(saved));
  auto second = LoadOrCalibrate(*engine_, "auto", {});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->source, "file:" + saved);
  EXPECT_DOUBLE_EQ(second->prefill_per_token_s, first->prefill_per_token_s);
  // A profile for another chunk size is another file.
  CalibrationOptions other;
  other.max_batch_tokens = 64;
  EXPECT_NE(DefaultProfilePath(*engine_, other), saved);
}

TEST_F(CalibrationTest, ExplicitFilesNoneAndBadProfiles) {
  auto none = LoadOrCalibrate(*engine_, "none", {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->valid());
  EXPECT_EQ(LoadOrCalibrate(*engine_, (dir_ / "missing.json").string(), {}).status().code(),
            StatusCode::kNotFound);
  std::filesystem::create_directories(dir_);
  const std::string bad = (dir_ / "bad.json").string();
  std::ofstream(bad) << "{\"prefill_base_s\": \"fast\"}";
  EXPECT_EQ(LoadOrCalibrate(*engine_, bad, {}).status().code(), StatusCode::kInvalidArgument);
  // A corrupt saved profile under "auto" is ignored and replaced by a fresh calibration.
  const std::string saved = DefaultProfilePath(*engine_, {});
  std::filesystem::create_directories(std::filesystem::path(saved).parent_path());
  std::ofstream(saved) << "not json";
  auto redone = LoadOrCalibrate(*engine_, "auto", {});
  ASSERT_TRUE(redone.ok()) << redone.status().ToString();
  EXPECT_EQ(redone->source, "calibrated");
  EXPECT_TRUE(ReadProfile(saved).ok());
}

}  // namespace
}  // namespace tandem::cluster
