// Instruction-set detection and the process-wide choice of kernel table.
#include "kernels/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/isa_internal.h"

namespace tandem::kernels {
namespace {

using internal::IsaImpl;

// cpuid and XCR0 directly (not __builtin_cpu_supports, whose feature names differ between
// compilers): a feature counts only when the CPU has it and the OS saves its registers.
uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Linux hands out the 8 KiB AMX tile state only to processes that ask (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); once granted it holds for every thread.
bool RequestTileData() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures Detect() {
  auto bit = [](uint32_t reg, int b) { return ((reg >> b) & 1u) != 0; };
  uint32_t a = 0, b = 0, c = 0, d = 0;
  CpuFeatures f;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = bit(c, 12), f16c = bit(c, 29), osxsave = bit(c, 27), avx = bit(c, 28);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // XMM and YMM state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = bit(b, 5), avx512f = bit(b, 16), avx512dq = bit(b, 17), avx512bw = bit(b, 30),
             avx512vl = bit(b, 31), avx512vnni = bit(c, 11), avx512fp16 = bit(d, 23),
             amx_bf16 = bit(d, 22), amx_tile = bit(d, 24);
  const uint32_t max_leaf7 = a;
  bool avx512bf16 = false;
  if (max_leaf7 >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512bf16 = bit(a, 5);
  }
  f.avx2 = os_ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni;
  f.avx512_bf16 = f.avx512 && avx512bf16;
  f.avx512_fp16 = f.avx512 && avx512fp16;
  const bool os_tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  f.amx_bf16 = f.avx512_bf16 && amx_tile && amx_bf16 && os_tiles && RequestTileData();
  return f;
}

// The table for a name, or null when unknown or not runnable here.
const IsaImpl* Lookup(const char* isa) {
  const CpuFeatures& cpu = DetectedCpuFeatures();
  if (std::strcmp(isa, "scalar") == 0) return internal::ScalarIsa();
  if (std::strcmp(isa, "avx2") == 0 && cpu.avx2) return internal::Avx2Isa();
  if (std::strcmp(isa, "avx512") == 0 && cpu.avx512) return internal::Avx512Isa();
  if (std::strcmp(isa, "amx") == 0 && cpu.amx_bf16) return internal::AmxIsa();
  return nullptr;
}

// The table when none is forced: $TANDEM_ISA where set to one the CPU runs (a warning on stderr
// otherwise), else the best the CPU has.
const IsaImpl* DefaultIsa() {
  static const IsaImpl* const isa = [] {
    const CpuFeatures& cpu = DetectedCpuFeatures();
    const IsaImpl* best = cpu.amx_bf16 ? internal::AmxIsa()
                          : cpu.avx512 ? internal::Avx512Isa()
                          : cpu.avx2   ? internal::Avx2Isa()
                                       : internal::ScalarIsa();
    const char* wanted = std::getenv("TANDEM_ISA");
    if (wanted == nullptr || *wanted == '\0' || std::strcmp(wanted, "auto") == 0) return best;
    const IsaImpl* chosen = Lookup(wanted);
    if (chosen == nullptr) {
      std::fprintf(stderr,
                   "tandem: TANDEM_ISA=%s is not an instruction set this CPU runs (scalar, avx2, "
                   "avx512, amx); using %s\n",
                   wanted, best->name);
      return best;
    }
    return chosen;
  }();
  return isa;
}

std::atomic<const IsaImpl*> g_forced{nullptr};

}  // namespace

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

namespace internal {
const IsaImpl* CurrentIsa() {
  const IsaImpl* forced = g_forced.load(std::memory_order_relaxed);
  return forced != nullptr ? forced : DefaultIsa();
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
