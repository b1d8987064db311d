// Internal to src/store: the checksum of an object's bytes, XXH3-64 (libxxhash). On x86-64 the
// library's run-time dispatch picks its AVX-512 / AVX2 / SSE2 code (the same value every way),
// so verifying a fetched KV block costs a fraction of copying it.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#else
#include <xxhash.h>
#endif

namespace tandem::store::internal {

inline uint64_t ObjectChecksum(const void* bytes, size_t size) {
#if defined(__x86_64__)
  return XXH3_64bits_dispatch(bytes, size);
#else
  return XXH3_64bits(bytes, size);
#endif
}

}  // namespace tandem::store::internal
