// The cpuid/XCR0 detection against the compiler's own (a different mechanism), and the scoped
// choice of instruction set.
#include "kernels/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace tandem::kernels {
namespace {

#if defined(__GNUC__) && !defined(__clang__)
// GCC's libgcc knows every feature name used here (clang 14 lacks some).
TEST(CpuIsaTest, DetectionAgreesWithTheCompilersOwn) {
  __builtin_cpu_init();
  const CpuFeatures& f = DetectedCpuFeatures();
  EXPECT_EQ(f.avx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                        __builtin_cpu_supports("f16c"));
  EXPECT_EQ(f.avx512,
            f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni"));
  EXPECT_EQ(f.avx512_bf16, f.avx512 && __builtin_cpu_supports("avx512bf16"));
  // amx_bf16 also needs the kernel to grant the tile state, which libgcc does not ask.
  EXPECT_TRUE(!f.amx_bf16 || __builtin_cpu_supports("amx-bf16"));
}
#endif

TEST(CpuIsaTest, TheDetectedIsaIsTheBestTheCpuHas) {
  const char* env = std::getenv("TANDEM_ISA");
  if (env != nullptr && *env != '\0' && std::string(env) != "auto") {
    GTEST_SKIP() << "TANDEM_ISA=" << env << " chooses the instruction set";
  }
  const CpuFeatures& f = DetectedCpuFeatures();
  const std::string expected = f.amx_bf16 ? "amx"
                               : f.avx512 ? "avx512"
                               : f.avx2   ? "avx2"
                                          : "scalar";
  EXPECT_EQ(ActiveIsa(), expected);
}

TEST(CpuIsaTest, ScopedIsaRestoresThePreviousChoice) {
  const std::string detected = ActiveIsa();
  {
    ScopedIsa scalar("scalar");
    ASSERT_TRUE(scalar.ok());
    EXPECT_STREQ(ActiveIsa(), "scalar");
    {
      ScopedIsa bogus("sse9");  // refused: nothing changes
      EXPECT_FALSE(bogus.ok());
      EXPECT_STREQ(ActiveIsa(), "scalar");
    }
    EXPECT_STREQ(ActiveIsa(), "scalar");
  }
  EXPECT_EQ(ActiveIsa(), detected);
}

}  // namespace
}  // namespace tandem::kernels
