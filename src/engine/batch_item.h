// One sequence's share of a forward step: its KV blocks, where its new tokens start, and which
// logits it wants. The unit Transformer::Forward (and MockForward) take in batches.
#pragma once

#include <cstdint>
#include <span>

namespace tandem::engine {

struct BatchItem {
  // The sequence's KV blocks; must cover start_pos + n. With sliding layers, the blocks from
  // the window of start_pos on must hold window storage (PagedKvCache::AttachWindow).
  std::span<const int32_t> block_table;
  int start_pos = 0;                // position of tokens[0] (= tokens already in the cache)
  std::span<const int32_t> tokens;  // n >= 1 new tokens
  bool want_logits = true;          // produce logits for the last token
  // Logits for every token of the item (prompt logprobs), n rows in position order, instead of
  // the last token's only (the last row is then the one want_logits would give).
  bool all_logits = false;
};

}  // namespace tandem::engine
