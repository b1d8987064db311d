#include "serving/prefix_cache.h"

#include <gtest/gtest.h>

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
