#include "common/fp16.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>

namespace tandem {
namespace {

// Every half value round-trips, and float->half agrees with the F16C instruction.
TEST(Fp16Test, AllHalfValuesRoundTripAndMatchHardware) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    const float hw = _cvtsh_ss(static_cast<unsigned short>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(f, hw) << h;
    ASSERT_EQ(Fp32ToFp16(f), h) << h;
  }
  for (float f : {1e-8f, 3.1e-5f, 6.1e-5f, 0.1f, 1.0f / 3, 65519.0f, 65520.0f, -2.5e-6f, 1e9f}) {
    EXPECT_EQ(Fp32ToFp16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << f;
  }
}

TEST(Fp16Test, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.00390625f), 0x3f80);  // halfway, even stays
  EXPECT_EQ(Fp32ToBf16(1.01171875f), 0x3f82);  // halfway, odd rounds up
}

}  // namespace
}  // namespace tandem
