// The prefix hash chain that names KV blocks everywhere: the local prefix cache, the worker's
// report of what it holds, and the conductor's cache-aware placement all key blocks this way.
//
// Key of block i of a token sequence = XXH3-64(the block_tokens token ids of block i, as int32
// little-endian bytes, seed = key of block i-1); block 0 uses seed 0. A key stands for the whole
// prefix up to the end of its block: equal keys mean equal prefixes (up to collisions, 2^-64).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::serving {

// Keys of the full blocks of `tokens` (tokens.size() / block_tokens of them). To continue a
// chain, pass the key of the block before tokens[0] as `seed` (0 starts a sequence).
std::vector<uint64_t> BlockKeys(std::span<const int32_t> tokens, int block_tokens,
                                uint64_t seed = 0);

// Sliding-window models (window_tokens > 0). A sequence resumes from the end of a prefix of
// n full blocks only with the sliding layers' KV (the window) of the blocks a query at position
// n * block_tokens reads: blocks [WindowStartBlock(n, ...), n). 0 when window_tokens is 0.
int WindowStartBlock(int n_blocks, int block_tokens, int window_tokens);

// Where a prefix can be resumed from, given which blocks' windows are at hand: the largest n in
// (from, limit] such that held[b - lo] for every block b in [max(from, WindowStartBlock(n)), n)
// (blocks below `from` are taken to have theirs), counting only the n whose range starts at lo
// or later; `from` if none. held covers blocks [lo, limit).
int ResumableEnd(const std::vector<bool>& held, int lo, int from, int limit, int block_tokens,
                 int window_tokens);

}  // namespace tandem::serving
