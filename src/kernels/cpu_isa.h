// The one instruction-set switch of the kernels. Every SIMD kernel (MatMul, attention, the FFN
// activation) runs through one per-ISA table (kernels/isa_internal.h), picked here: the best the
// CPU has, unless the environment variable TANDEM_ISA names another (A/B runs of whole
// processes) or code forces one (tests, benchmarks). Process-wide.
#pragma once

namespace tandem::kernels {

// What the CPU can run (and the OS enables), detected once from cpuid and XCR0.
struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA + F16C: the "avx2" path
  bool avx512 = false;       // + AVX-512 F/BW/VL/DQ/VNNI: the "avx512" path
  bool avx512_bf16 = false;  // AVX-512 BF16 dot products (the amx path converts with them)
  bool avx512_fp16 = false;  // AVX-512 FP16 arithmetic (reported; no kernel uses them)
  // + AMX tiles with BF16 products, enabled by the OS and granted to this process: the "amx" path
  bool amx_bf16 = false;
};
const CpuFeatures& DetectedCpuFeatures();

// The instruction set the kernels use now: "amx" (the avx512 kernels with attention on AMX
// tiles), "avx512", "avx2" or "scalar".
const char* ActiveIsa();

// Forces an instruction set: "scalar", "avx2", "avx512", "amx"; "auto" or nullptr
// returns to the default one (the environment variable TANDEM_ISA, read once, else the best
// detected). Returns false (and changes nothing) for a name the CPU cannot run. Not to be called
// while kernels run on other threads.
bool ForceIsa(const char* isa);

// Forces an instruction set for a scope (tests) and restores the previous choice on exit, even
// when a test assertion returns early. ok() is false when the CPU lacks it (then nothing
// changed: GTEST_SKIP or compare against the scalar path only).
class ScopedIsa {
 public:
  explicit ScopedIsa(const char* isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
  bool ok() const { return ok_; }

 private:
  const void* previous_;  // the forced table before, or null for "auto"
  bool ok_;
};

}  // namespace tandem::kernels
