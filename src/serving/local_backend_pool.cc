// LocalBackendImpl: reading from and offering to the cluster's KV pool.
#include "serving/block_keys.h"
#include "serving/local_backend_impl_internal.h"

namespace tandem::serving::internal {

bool LocalBackendImpl::UsesPool() const {
  return options_.kv_pool != nullptr && options_.enable_prefix_cache;
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

int LocalBackendImpl::ReadFromPool(std::span<const uint64_t> keys, std::span<const int32_t> table,
                                   int from) {
  const int want = static_cast<int>(keys.size());
  if (from >= want) return from;
  KvPool& pool = *options_.kv_pool;
  const bool sliding = kv_.num_window_blocks() > 0;
  const int window = kv_.shape().window_tokens;
  // Sliding layers: where the pool holds the windows a resumed sequence reads. Blocks below
  // `from` are the local prefix's, whose windows are stored (PrefixCache::Match).
  const int lo = sliding ? std::max(from, WindowStartBlock(from + 1, block_tokens_, window)) : from;
  std::vector<bool> held;
  int end = want;
  if (sliding) {
    held = pool.HeldWindows(keys.subspan(lo));
    end = ResumableEnd(held, lo, from, want, block_tokens_, window);
    if (end == from) return from;  // no resumable end: the blocks are not worth reading
  }
  const Clock::time_point start = Clock::now();
  const int filled = pool.Fetch(keys.subspan(from, end - from), table.subspan(from, end - from));
  end = from + filled;
  if (sliding && filled > 0) {
    end = ResumableEnd(held, lo, from, end, block_tokens_, window);
    if (end > from && !ReadWindows(keys, table, from, end)) {
      pool_window_misses_.fetch_add(1);
      end = from;
    }
  }
  fetch_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  fetched_blocks_ += end - from;
  for (int b = from; b < end; ++b) prefix_cache_.Insert(keys[b], table[b]);
  PinWindowsBehind(table, end);
  pool_hit_tokens_.fetch_add(int64_t{end - from} * block_tokens_);
  return end;
}

bool LocalBackendImpl::ReadWindows(std::span<const uint64_t> keys, std::span<const int32_t> table,
                                   int from, int end) {
  const int first = std::max(from, kv_.WindowStartBlock(int64_t{end} * block_tokens_));
  const int n = end - first;
  if (n <= 0) return true;
  if (!AttachWindow(table, int64_t{first} * block_tokens_, int64_t{end} * block_tokens_).ok()) {
    return false;
  }
  std::vector<int32_t> windows;
  for (int b = first; b < end; ++b) windows.push_back(kv_.window_block(table[b]));
  if (options_.kv_pool->FetchWindows(keys.subspan(first, n), windows) == n) return true;
  for (int b = first; b < end; ++b) kv_.DropWindow(table[b]);  // fresh blocks: ours alone
  return false;
}

void LocalBackendImpl::FetchFromPool(Sequence& s) {
  const int have = s.n_computed / block_tokens_;
  const int max_blocks = static_cast<int>((s.tokens.size() - 1) / block_tokens_);
  if (have >= max_blocks) return;
  const int end = ReadFromPool(KeysOf(s, s.tokens.size()).first(max_blocks), s.blocks, have);
  if (end > have) {
    s.n_computed = end * block_tokens_;
    s.pool_known = end;
  }
}

void LocalBackendImpl::OfferToPool(Sequence& s) {
  if (!UsesPool()) return;
  const auto keys = KeysOf(s, s.n_computed);
  const size_t n = std::min(keys.size(), s.blocks.size());
  const size_t from = std::min(n, static_cast<size_t>(s.pool_known));
  if (from < n) {
    options_.kv_pool->Offer(keys.subspan(from, n - from),
                            std::span(s.blocks).subspan(from, n - from));
    s.pool_known = static_cast<int>(n);
  }
  if (kv_.num_window_blocks() == 0 || n == 0) return;
  // The windows it still holds: those behind its end, and those the prefix cache pinned behind
  // its prompt's end (OfferBlocks), so that a sequence resumes from either; the others were
  // given back as it moved on.
  std::vector<uint64_t> window_keys;
  std::vector<int32_t> windows;
  for (size_t b = 0; b < n; ++b) {
    if (!kv_.HasWindow(s.blocks[b])) continue;
    window_keys.push_back(keys[b]);
    windows.push_back(kv_.window_block(s.blocks[b]));
  }
  options_.kv_pool->OfferWindows(window_keys, windows);
}

void LocalBackendImpl::OfferBlocks(Sequence& s) {
  if (!options_.enable_prefix_cache) return;
  const auto keys = KeysOf(s, s.n_computed);
  const size_t n = std::min(keys.size(), s.blocks.size());
  for (size_t i = 0; i < n; ++i) prefix_cache_.Insert(keys[i], s.blocks[i]);
  PinWindowsBehind(s.blocks, static_cast<int>(n));
}

void LocalBackendImpl::PinWindowsBehind(std::span<const int32_t> table, int end) {
  if (kv_.num_window_blocks() == 0) return;
  for (int b = kv_.WindowStartBlock(int64_t{end} * block_tokens_); b < end; ++b) {
    if (kv_.HasWindow(table[b])) prefix_cache_.PinWindow(table[b]);
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
