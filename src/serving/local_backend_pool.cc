// LocalBackendImpl: reading from and offering to the cluster's KV pool.
#include "serving/local_backend_impl_internal.h"

namespace tandem::serving::internal {

bool LocalBackendImpl::UsesPool() const {
  return options_.kv_pool != nullptr && options_.enable_prefix_cache &&
         kv_.num_window_blocks() == 0;
}

bool LocalBackendImpl::FetchPaysOff() {
  const int64_t computed = computed_prefill_.load();
  if (fetched_blocks_ < kMinFetchedBlocks || computed == 0) return true;
  const double fetch_s = static_cast<double>(fetch_ns_) * 1e-9 / fetched_blocks_;
  const double compute_s =
      static_cast<double>(busy_us_prefill_.load()) * 1e-6 / computed * block_tokens_;
  if (fetch_s < compute_s || ++skipped_in_a_row_ >= kFetchProbeEvery) {
    skipped_in_a_row_ = 0;
    return true;
  }
  pool_fetches_skipped_.fetch_add(1);
  return false;
}

void LocalBackendImpl::FetchFromPool(Sequence& s) {
  const int have = s.n_computed / block_tokens_;
  const int max_blocks = static_cast<int>((s.tokens.size() - 1) / block_tokens_);
  if (have >= max_blocks) return;
  const auto keys = KeysOf(s, s.tokens.size()).subspan(have, max_blocks - have);
  const Clock::time_point start = Clock::now();
  const int filled =
      options_.kv_pool->Fetch(keys, std::span(s.blocks).subspan(have, max_blocks - have));
  fetch_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  fetched_blocks_ += filled;
  for (int i = 0; i < filled; ++i) prefix_cache_.Insert(keys[i], s.blocks[have + i]);
  if (filled > 0) {
    s.n_computed += filled * block_tokens_;
    s.pool_known = have + filled;
    pool_hit_tokens_.fetch_add(int64_t{filled} * block_tokens_);
  }
}

void LocalBackendImpl::OfferToPool(Sequence& s) {
  if (!UsesPool()) return;
  const auto keys = KeysOf(s, s.n_computed);
  const size_t n = std::min(keys.size(), s.blocks.size());
  const size_t from = std::min(n, static_cast<size_t>(s.pool_known));
  if (from == n) return;
  options_.kv_pool->Offer(keys.subspan(from, n - from),
                          std::span(s.blocks).subspan(from, n - from));
  s.pool_known = static_cast<int>(n);
}

void LocalBackendImpl::OfferBlocks(Sequence& s) {
  if (!options_.enable_prefix_cache) return;
  const auto keys = KeysOf(s, s.n_computed);
  const size_t n = std::min(keys.size(), s.blocks.size());
  for (size_t i = 0; i < n; ++i) prefix_cache_.Insert(keys[i], s.blocks[i]);
  for (size_t i = kv_.WindowStartBlock(static_cast<int64_t>(n) * block_tokens_); i < n; ++i) {
    if (kv_.HasWindow(s.blocks[i])) prefix_cache_.PinWindow(s.blocks[i]);
  }
}

std::span<const uint64_t> LocalBackendImpl::KeysOf(Sequence& s, size_t n_tokens) {
  const size_t want = n_tokens / block_tokens_;
  if (s.keys.size() < want) {
    const size_t done = s.keys.size();
    const uint64_t seed = done == 0 ? 0 : s.keys.back();
    const auto more = PrefixCache::BlockKeys(
        std::span(s.tokens).subspan(done * block_tokens_, (want - done) * block_tokens_),
        block_tokens_, seed);
    s.keys.insert(s.keys.end(), more.begin(), more.end());
  }
  return std::span(s.keys).first(want);
}

}  // namespace tandem::serving::internal
