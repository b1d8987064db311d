#include "serving/prefix_cache.h"

#include <gtest/gtest.h>

#include "serving/block_keys.h"

namespace tandem::serving {
namespace {

std::unique_ptr<engine::PagedKvCache> SmallKv(int blocks) {
  return std::move(
      engine::PagedKvCache::Create(
          {.n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .block_tokens = 4, .num_blocks = blocks})
          .value());
}

TEST(PrefixCacheTest, KeysChainOverWholeBlocks) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 0};
  const auto ka = PrefixCache::BlockKeys(a, 4), kb = PrefixCache::BlockKeys(b, 4);
  ASSERT_EQ(ka.size(), 2u);  // the partial third block has no key
  ASSERT_EQ(kb.size(), 2u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  // The same block content after a different prefix gets a different key.
  const std::vector<int32_t> c = {9, 9, 9, 9, 5, 6, 7, 8};
  EXPECT_NE(PrefixCache::BlockKeys(c, 4)[1], ka[1]);
}

TEST(PrefixCacheTest, SeededKeysContinueTheChain) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const auto whole = PrefixCache::BlockKeys(t, 4);
  const auto tail = PrefixCache::BlockKeys(std::span(t).subspan(4), 4, whole[0]);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], whole[1]);
  EXPECT_EQ(tail[1], whole[2]);
}

// 4-token blocks and an 8-token window: a sequence resuming at block n (position 4n) reads
// positions [4n - 7, 4n] in a sliding layer, so it needs the windows of blocks [n - 2, n): the
// KV cache's own rule (PagedKvCache::WindowStartBlock) and the pool's agree.
TEST(PrefixCacheTest, ResumableEndNeedsTheWindowsBehindIt) {
  auto kv = std::move(engine::PagedKvCache::Create({.n_layers = 2,
                                                    .n_kv_heads = 1,
                                                    .head_dim = 8,
                                                    .block_tokens = 4,
                                                    .num_blocks = 8,
                                                    .sliding = {true, false},
                                                    .window_tokens = 8,
                                                    .num_window_blocks = 8})
                          .value());
  for (int n = 0; n <= 8; ++n) {
    EXPECT_EQ(WindowStartBlock(n, 4, 8), kv->WindowStartBlock(4 * n)) << n;
  }
  EXPECT_EQ(WindowStartBlock(5, 4, 8), 3);
  EXPECT_EQ(WindowStartBlock(5, 4, 0), 0);  // no sliding layers

  // Windows held for blocks 2, 3, 5, 6, 7 (of blocks [0, 8)).
  const std::vector<bool> held = {false, false, true, true, false, true, true, true};
  EXPECT_EQ(ResumableEnd(held, 0, 0, 8, 4, 8), 8);  // needs 6, 7
  EXPECT_EQ(ResumableEnd(held, 0, 0, 7, 4, 8), 7);  // needs 5, 6
  EXPECT_EQ(ResumableEnd(held, 0, 0, 6, 4, 8), 4);  // 6 and 5 need block 4; 4 needs 2, 3
  EXPECT_EQ(ResumableEnd(held, 0, 0, 3, 4, 8), 0);  // 3 needs 1, 2; 2 and 1 need block 0
  // A local prefix of `from` blocks has its windows: from 5, block 4 is no longer needed.
  EXPECT_EQ(ResumableEnd({true, true, true}, 5, 5, 8, 4, 8), 8);
  EXPECT_EQ(ResumableEnd({false, true, true, true}, 4, 4, 6, 4, 8), 4);  // 5 and 6 need 4
  EXPECT_EQ(ResumableEnd({false, true, true, true}, 4, 4, 8, 4, 8), 8);
  // Ends whose range starts before the answers (lo) do not count.
  EXPECT_EQ(ResumableEnd({true, true}, 4, 0, 6, 4, 8), 6);  // 6 needs 4, 5
  EXPECT_EQ(ResumableEnd({true, true}, 4, 0, 5, 4, 8), 0);  // 5 needs 3, 4: 3 unknown
  EXPECT_EQ(ResumableEnd({}, 0, 0, 0, 4, 8), 0);
}

TEST(PrefixCacheTest, MatchTakesReferencesAndEvictSparesBlocksInUse) {
  auto kv = SmallKv(8);
  PrefixCache cache(kv.get());
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const auto keys = PrefixCache::BlockKeys(tokens, 4);
  auto blocks = kv->Allocate(3).value();
  for (int i = 0; i < 3; ++i) cache.Insert(keys[i], blocks[i]);
  cache.Insert(keys[0], blocks[1]);  // already cached: ignored
  EXPECT_EQ(cache.cached_blocks(), 3);
  kv->Release(blocks);  // the sequence is done; only the cache holds them
  EXPECT_EQ(kv->num_free(), 5);

  auto hit = cache.Match(keys, 2);  // at most two blocks
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], blocks[0]);
  EXPECT_EQ(kv->ref_count(hit[0]), 2);
  // Only the third block is unused by the matcher: eviction frees exactly it.
  EXPECT_EQ(cache.Evict(3), 1);
  EXPECT_EQ(kv->num_free(), 6);
  kv->Release(hit);
  EXPECT_EQ(cache.Evict(5), 2);
  EXPECT_EQ(kv->num_free(), 8);
  EXPECT_TRUE(cache.Match(keys, 3).empty());
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedFirst) {
  auto kv = SmallKv(4);
  PrefixCache cache(kv.get());
  auto blocks = kv->Allocate(2).value();
  const std::vector<int32_t> x = {1, 1, 1, 1}, y = {2, 2, 2, 2};
  const auto kx = PrefixCache::BlockKeys(x, 4), ky = PrefixCache::BlockKeys(y, 4);
  cache.Insert(kx[0], blocks[0]);
  cache.Insert(ky[0], blocks[1]);
  kv->Release(blocks);
  kv->Release(cache.Match(kx, 1));  // x used more recently than y
  EXPECT_EQ(cache.Evict(1), 1);
  EXPECT_TRUE(cache.Match(ky, 1).empty());
  auto still = cache.Match(kx, 1);
  EXPECT_EQ(still.size(), 1u);
  kv->Release(still);
}

}  // namespace
}  // namespace tandem::serving
