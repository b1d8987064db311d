// Instruction-set detection and the process-wide choice of kernel table.
#include "kernels/cpu_isa.h"

#include <atomic>
#include <cstring>

#include "kernels/isa_internal.h"

namespace tandem::kernels {
namespace {

using internal::IsaImpl;

CpuFeatures Detect() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  f.avx512_fp16 = f.avx512 && __builtin_cpu_supports("avx512fp16");
  return f;
}

const IsaImpl* DetectedIsa() {
  static const IsaImpl* const isa = DetectedCpuFeatures().avx512 ? internal::Avx512Isa()
                                    : DetectedCpuFeatures().avx2 ? internal::Avx2Isa()
                                                                 : internal::ScalarIsa();
  return isa;
}

std::atomic<const IsaImpl*> g_forced{nullptr};

// The table for a name, or null when unknown or not runnable here.
const IsaImpl* Lookup(const char* isa) {
  const CpuFeatures& cpu = DetectedCpuFeatures();
  if (std::strcmp(isa, "scalar") == 0) return internal::ScalarIsa();
  if (std::strcmp(isa, "avx2") == 0 && cpu.avx2) return internal::Avx2Isa();
  if (std::strcmp(isa, "avx512") == 0 && cpu.avx512) return internal::Avx512Isa();
  return nullptr;
}

}  // namespace

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

namespace internal {
const IsaImpl* CurrentIsa() {
  const IsaImpl* forced = g_forced.load(std::memory_order_relaxed);
  return forced != nullptr ? forced : DetectedIsa();
}
}  // namespace internal

const char* ActiveIsa() { return internal::CurrentIsa()->name; }

bool ForceIsa(const char* isa) {
  if (isa == nullptr || std::strcmp(isa, "auto") == 0) {
    g_forced.store(nullptr);
    return true;
  }
  const IsaImpl* impl = Lookup(isa);
  if (impl == nullptr) return false;
  g_forced.store(impl);
  return true;
}

ScopedIsa::ScopedIsa(const char* isa) : previous_(g_forced.load()), ok_(ForceIsa(isa)) {}

ScopedIsa::~ScopedIsa() { g_forced.store(static_cast<const IsaImpl*>(previous_)); }

}  // namespace tandem::kernels
