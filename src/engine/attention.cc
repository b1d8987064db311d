#include "engine/attention.h"

#include <algorithm>
#include <vector>

namespace tandem::engine {

void AttendTile(const AttentionArgs& a, int first_pos, int n_tokens, int kv_head, const float* q,
                int64_t q_stride, float* out, int64_t out_stride) {
  const KvCacheShape& sh = a.kv->shape();
  const int group = a.n_heads / sh.n_kv_heads;
  const int last_key = std::min(first_pos + n_tokens - 1, a.key_end - 1);
  const int n_blocks = std::max(0, last_key / sh.block_tokens + 1);
  thread_local std::vector<const uint16_t*> keys, values;
  keys.resize(n_blocks);
  values.resize(n_blocks);
  const kernels::AttentionTile tile{keys.data(), values.data(), sh.head_dim, sh.block_tokens,
                                    group,       a.scale,       a.window,    a.key_begin,
                                    a.key_end,   a.partial};
  const int first_block = kernels::FirstVisibleBlock(tile, first_pos);
  for (int b = 0; b < std::min(first_block, n_blocks); ++b) keys[b] = values[b] = nullptr;
  for (int b = first_block; b < n_blocks; ++b) {
    keys[b] = a.kv->Keys(a.block_table[b], a.layer, kv_head);
    values[b] = a.kv->Values(a.block_table[b], a.layer, kv_head);
  }
  const int64_t head_offset = static_cast<int64_t>(kv_head) * group * sh.head_dim;
  kernels::AttendTile(tile, first_pos, n_tokens, q + head_offset, q_stride, out + head_offset,
                      out_stride);
}

}  // namespace tandem::engine
