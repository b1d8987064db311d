// This process's memory as the kernel counts it (/proc/self/status): the resident set now and
// its peak since the process started, in bytes. The peak is what a memory budget is held to.
//
// Thread-safety: thread-safe (reads a file).
#pragma once

#include <cstdint>

namespace tandem {

struct ProcessMemory {
  int64_t resident_bytes = 0;       // VmRSS: anonymous, file-backed and shared pages resident
  int64_t peak_resident_bytes = 0;  // VmHWM
};

// Zeros when /proc is not readable.
ProcessMemory ReadProcessMemory();

// Resets the peak (VmHWM) to the resident set now, so that a later peak_resident_bytes covers
// only what came after (a benchmark that freed a large buffer before the part it reports).
// False where the kernel does not allow it (/proc/self/clear_refs not writable).
bool ResetPeakResident();

}  // namespace tandem
