#include "common/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace tandem {
namespace {

TEST(ProcessMemory, TheResidentSetGrowsWithTouchedMemoryAndThePeakStays) {
  const ProcessMemory before = ReadProcessMemory();
  ASSERT_GT(before.resident_bytes, 0);
  ASSERT_GE(before.peak_resident_bytes, before.resident_bytes);
  constexpr size_t kBytes = 64 << 20;
  {
    auto block = std::make_unique<char[]>(kBytes);
    std::memset(block.get(), 1, kBytes);  // every page touched
    const ProcessMemory during = ReadProcessMemory();
    EXPECT_GE(during.resident_bytes, before.resident_bytes + int64_t{kBytes} * 9 / 10);
    EXPECT_GE(during.peak_resident_bytes, during.resident_bytes);
    volatile char sink = block[kBytes - 1];
    (void)sink;
  }
  const ProcessMemory after = ReadProcessMemory();
  EXPECT_GE(after.peak_resident_bytes, before.resident_bytes + int64_t{kBytes} * 9 / 10)
      << "the peak remembers the freed block";
}

TEST(ProcessMemory, AResetPeakForgetsAFreedBlock) {
  constexpr size_t kBytes = 128 << 20;
  {
    auto block = std::make_unique<char[]>(kBytes);  // above malloc's mmap threshold: unmapped
    std::memset(block.get(), 1, kBytes);            // when freed
    volatile char sink = block[kBytes - 1];
    (void)sink;
  }
  const ProcessMemory freed = ReadProcessMemory();
  ASSERT_GE(freed.peak_resident_bytes, freed.resident_bytes + int64_t{kBytes} * 9 / 10);
  if (!ResetPeakResident()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  const ProcessMemory reset = ReadProcessMemory();
  EXPECT_LT(reset.peak_resident_bytes, freed.peak_resident_bytes - int64_t{kBytes} / 2);
  EXPECT_GE(reset.peak_resident_bytes, reset.resident_bytes);
}

}  // namespace
}  // namespace tandem
