#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

namespace tandem::engine {
namespace {

KvCacheShape Shape() {
  return {.n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .block_tokens = 4, .num_blocks = 10};
}

TEST(KvCacheTest, LayerSlicesAreContiguousAndDisjoint) {
  auto kv = std::move(PagedKvCache::Create(Shape()).value());
  // K and V of 2 heads x 4 tokens x 8 dims, fp16.
  EXPECT_EQ(kv->LayerSliceBytes(), 2u * 2 * 4 * 8 * 2);
  EXPECT_EQ(kv->BlockBytes(), 3 * kv->LayerSliceBytes());
  // The per-token figure capacity planning uses is the layout's: a block holds block_tokens.
  EXPECT_EQ(static_cast<int64_t>(kv->BlockBytes()), Shape().BytesPerToken() * 4);
  std::set<const uint8_t*> starts;
  for (int b = 0; b < 10; ++b) {
    for (int l = 0; l < 3; ++l) {
      auto* slice = kv->data() + kv->LayerSliceOffset(b, l);
      EXPECT_TRUE(starts.insert(slice).second);
      // Every head's K and V lie inside the slice.
      for (int h = 0; h < 2; ++h) {
        auto* k = reinterpret_cast<uint8_t*>(kv->Keys(b, l, h));
        auto* v = reinterpret_cast<uint8_t*>(kv->Values(b, l, h));
        EXPECT_GE(k, slice);
        EXPECT_LE(v + 4 * 8 * 2, slice + kv->LayerSliceBytes());
      }
    }
  }
  EXPECT_EQ(kv->LayerSliceOffset(9, 2) + kv->LayerSliceBytes(), kv->SizeBytes());
}

TEST(KvCacheTest, AllocateIsAllOrNothingAndRefCounted) {
  auto kv = std::move(PagedKvCache::Create(Shape()).value());
  auto a = kv->Allocate(6);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(kv->num_free(), 4);
  auto too_many = kv->Allocate(5);
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->num_free(), 4);
  kv->AddRef((*a)[0]);
  kv->Release(*a);
  EXPECT_EQ(kv->num_free(), 9);  // block a[0] still held once
  kv->Release((*a)[0]);
  EXPECT_EQ(kv->num_free(), 10);
  kv->Release((*a)[0]);  // double release is ignored
  EXPECT_EQ(kv->num_free(), 10);
  EXPECT_EQ(kv->BlocksFor(0), 0);
  EXPECT_EQ(kv->BlocksFor(4), 1);
  EXPECT_EQ(kv->BlocksFor(5), 2);
}

TEST(KvCacheTest, RefusesBadShapes) {
  KvCacheShape s = Shape();
  s.num_blocks = 0;
  EXPECT_FALSE(PagedKvCache::Create(s).ok());
}

}  // namespace
}  // namespace tandem::engine
