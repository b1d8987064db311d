#include "serving/block_keys.h"

#include <xxhash.h>

#include <algorithm>

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

int WindowStartBlock(int n_blocks, int block_tokens, int window_tokens) {
  if (window_tokens <= 0 || block_tokens <= 0) return 0;
  const int64_t start = std::max<int64_t>(0, int64_t{n_blocks} * block_tokens - window_tokens + 1);
  return static_cast<int>(start / block_tokens);
}

int ResumableEnd(const std::vector<bool>& held, int lo, int from, int limit, int block_tokens,
                 int window_tokens) {
  int run = 0;  // consecutive held windows ending at block n - 1
  int best = from;
  for (int n = lo + 1; n <= limit; ++n) {
    const size_t i = static_cast<size_t>(n - 1 - lo);
    run = i < held.size() && held[i] ? run + 1 : 0;
    const int start = std::max(from, WindowStartBlock(n, block_tokens, window_tokens));
    if (n > from && start >= lo && n - start <= run) best = n;
  }
  return best;
}

}  // namespace tandem::serving
