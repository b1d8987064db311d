#include "common/process_memory.h"

#include <cstdio>
#include <cstring>

namespace tandem {

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kib = 0;
    // Lines such as "VmRSS:\t  123456 kB".
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.resident_bytes = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak_resident_bytes = kib * 1024;
  }
  std::fclose(f);
  return m;
}

bool ResetPeakResident() {
  FILE* f = std::fopen("/proc/self/clear_refs", "we");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;  // 5: reset the peak resident set size
  return std::fclose(f) == 0 && ok;
}

}  // namespace tandem
