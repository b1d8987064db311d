#include "serving/block_keys.h"

#include <xxhash.h>

namespace tandem::serving {

std::vector<uint64_t> BlockKeys(std::span<const int32_t> tokens, int block_tokens, uint64_t seed) {
  if (block_tokens <= 0) return {};
  std::vector<uint64_t> keys(tokens.size() / block_tokens);
  uint64_t prev = seed;
  for (size_t i = 0; i < keys.size(); ++i) {
    prev = XXH3_64bits_withSeed(tokens.data() + i * block_tokens, block_tokens * sizeof(int32_t),
                                prev);
    keys[i] = prev;
  }
  return keys;
}

}  // namespace tandem::serving
