// The SSD tier against a real directory: round trips, damaged files, capacity, restarts.
#include "store/ssd_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

namespace tandem::store {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kObject = 8192;

std::vector<uint8_t> Bytes(uint32_t seed) {
  std::vector<uint8_t> b(kObject);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

class SsdTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem-ssd-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<SsdTier> Open(uint64_t capacity = 64 * kObject) {
    auto t = SsdTier::Open({dir_.string(), capacity});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }

  // The one .kv file in the directory.
  fs::path OnlyFile() const {
    fs::path found;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() == ".kv") found = e.path();
    }
    return found;
  }

  fs::path dir_;
};

TEST_F(SsdTierTest, WhatIsWrittenIsReadBack) {
  auto t = Open();
  ASSERT_NE(t, nullptr);
  const auto a = Bytes(1), b = Bytes(2);
  EXPECT_TRUE(t->Offer("ns/a", a.data(), kObject));
  EXPECT_TRUE(t->Offer("ns/b", b.data(), kObject));
  t->Flush();
  std::vector<uint8_t> out(kObject);
  ASSERT_TRUE(t->Read("ns/a", out.data(), kObject));
  EXPECT_EQ(out, a);
  ASSERT_TRUE(t->Read("ns/b", out.data(), kObject));
  EXPECT_EQ(out, b);
  EXPECT_TRUE(t->Holds("ns/a"));
  EXPECT_FALSE(t->Holds("ns/c"));
  EXPECT_FALSE(t->Read("ns/c", out.data(), kObject));      // never written
  EXPECT_FALSE(t->Read("ns/a", out.data(), kObject / 2));  // another geometry: a miss
  const SsdTierStats s = t->Stats();
  EXPECT_EQ(s.written, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.objects, 2u);
  EXPECT_GT(s.used_bytes, 2 * kObject);
}

TEST_F(SsdTierTest, ACorruptedFileIsAMissAndIsDeleted) {
  auto t = Open();
  const auto a = Bytes(3);
  ASSERT_TRUE(t->Offer("ns/a", a.data(), kObject));
  t->Flush();
  const fs::path file = OnlyFile();
  ASSERT_FALSE(file.empty());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 100));
    f.put('\x5a' ^ static_cast<char>(a[kObject - 100]));  // one byte of the object changed
  }
  std::vector<uint8_t> out(kObject);
  EXPECT_FALSE(t->Read("ns/a", out.data(), kObject));
  EXPECT_EQ(t->Stats().corrupt, 1u);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(t->Stats().objects, 0u);
}

TEST_F(SsdTierTest, ARestartFindsTheFilesAndDropsTornOnes) {
  {
    auto t = Open();
    for (uint32_t i = 0; i < 3; ++i) {
      const auto b = Bytes(10 + i);
      ASSERT_TRUE(t->Offer("ns/" + std::to_string(i), b.data(), kObject));
    }
    t->Flush();
  }
  // Tear one file (a crash mid-write without the rename would leave a .tmp; a torn .kv is a
  // damaged disk) and leave a stray temporary.
  int torn = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().extension() == ".kv" && torn++ == 0) fs::resize_file(e.path(), 100);
  }
  std::ofstream(dir_ / "0123456789abcdef.kv.tmp") << "partial";
  auto t = Open();
  EXPECT_EQ(t->Stats().objects, 2u);
  EXPECT_FALSE(fs::exists(dir_ / "0123456789abcdef.kv.tmp"));
  int read = 0;
  std::vector<uint8_t> out(kObject);
  for (uint32_t i = 0; i < 3; ++i) {
    if (t->Read("ns/" + std::to_string(i), out.data(), kObject)) {
      EXPECT_EQ(out, Bytes(10 + i));
      ++read;
    }
  }
  EXPECT_EQ(read, 2);
}

TEST_F(SsdTierTest, TheLeastRecentlyUsedGoFirstWithinTheCapacity) {
  // Room for three objects (each file is the object plus a header and its key).
  auto t = Open(3 * (kObject + 64));
  std::vector<uint8_t> out(kObject);
  for (uint32_t i = 0; i < 3; ++i) {
    const auto b = Bytes(20 + i);
    ASSERT_TRUE(t->Offer("ns/" + std::to_string(i), b.data(), kObject));
    t->Flush();
  }
  ASSERT_TRUE(t->Read("ns/0", out.data(), kObject));  // 0 is now the most recently used
  const auto b = Bytes(23);
  ASSERT_TRUE(t->Offer("ns/3", b.data(), kObject));
  t->Flush();
  EXPECT_TRUE(t->Read("ns/0", out.data(), kObject));
  EXPECT_FALSE(t->Read("ns/1", out.data(), kObject));  // evicted
  EXPECT_TRUE(t->Read("ns/3", out.data(), kObject));
  EXPECT_EQ(t->Stats().evictions, 1u);
  EXPECT_LE(t->Stats().used_bytes, 3 * (kObject + 64));
  // An object larger than the whole tier is refused at once.
  std::vector<uint8_t> big(4 * kObject);
  EXPECT_FALSE(t->Offer("ns/big", big.data(), big.size()));
  EXPECT_EQ(t->Stats().dropped, 1u);
}

TEST_F(SsdTierTest, AnUnusableDirectoryIsAClearError) {
  auto t = SsdTier::Open({"/dev/null/blocks", 1 << 20});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("/dev/null/blocks"), std::string::npos);
  EXPECT_EQ(SsdTier::Open({dir_.string(), 0}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::store
