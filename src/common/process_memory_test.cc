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

}  // namespace
}  // namespace tandem
