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

// Layers 1 and 3 of 4 slide over 6 positions; blocks of 4 tokens.
KvCacheShape SlidingShape() {
  KvCacheShape s = Shape();
  s.n_layers = 4;
  s.sliding = {false, true, false, true};
  s.window_tokens = 6;
  s.num_window_blocks = 5;
  return s;
}

TEST(KvCacheTest, SlidingLayersLiveInTheWindowArena) {
  const KvCacheShape shape = SlidingShape();
  EXPECT_EQ(shape.NumSlidingLayers(), 2);
  EXPECT_EQ(shape.GlobalBytesPerToken() * 2, shape.BytesPerToken());
  auto kv = std::move(PagedKvCache::Create(shape).value());
  EXPECT_EQ(kv->BlockBytes(), 2 * kv->LayerSliceBytes());  // the global layers only
  EXPECT_EQ(kv->WindowArenaOffset(), 10 * kv->BlockBytes());
  EXPECT_EQ(kv->SizeBytes(), kv->WindowArenaOffset() + 5 * 2 * kv->LayerSliceBytes());
  auto blocks = kv->Allocate(10).value();
  EXPECT_EQ(kv->num_free_window(), 5);  // allocation lends no window storage
  // All or nothing: 5 window blocks for 10 blocks do not go.
  EXPECT_EQ(kv->AttachWindow(blocks, 0, 40).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->num_free_window(), 5);
  ASSERT_TRUE(kv->AttachWindow(std::span(blocks).first(5), 0, 20).ok());
  EXPECT_EQ(kv->num_free_window(), 0);
  // Every slice, global or sliding, is its own range inside the buffer.
  std::set<size_t> starts;
  for (int b = 0; b < 5; ++b) {
    for (int l = 0; l < 4; ++l) {
      const size_t off = kv->LayerSliceOffset(blocks[b], l);
      EXPECT_TRUE(starts.insert(off).second);
      EXPECT_LE(off + kv->LayerSliceBytes(), kv->SizeBytes());
      EXPECT_EQ(off >= kv->WindowArenaOffset(), shape.IsSliding(l));
      EXPECT_EQ(off, kv->SliceOffsetIn(kv->WindowArenaOffset(), blocks[b],
                                       kv->window_block(blocks[b]), l));
    }
  }
}

TEST(KvCacheTest, WindowsAreLentWhileInsideTheWindow) {
  auto kv = std::move(PagedKvCache::Create(SlidingShape()).value());
  const auto t = kv->Allocate(6).value();  // 24 positions
  ASSERT_TRUE(kv->AttachWindow(t, 0, 12).ok());
  EXPECT_EQ(kv->num_free_window(), 2);
  EXPECT_TRUE(kv->CheckWindow(t, 8, 12).ok());
  EXPECT_EQ(kv->CheckWindow(t, 12, 13).code(), StatusCode::kFailedPrecondition);  // block 3
  // A query at 12 sees 7..12: block 0 has left every window.
  EXPECT_EQ(kv->WindowStartBlock(12), 1);
  EXPECT_EQ(kv->TrimWindow(t, 12), 1);
  EXPECT_FALSE(kv->HasWindow(t[0]));
  EXPECT_TRUE(kv->CheckWindow(t, 12, 12).ok());
  // Shared blocks keep their window, unless the other holders are passive.
  kv->AddRef(t[1]);
  EXPECT_EQ(kv->TrimWindow(t, 16), 0);
  EXPECT_EQ(kv->TrimWindow(t, 16, [&](int32_t b) { return b == t[1] ? 1 : 0; }), 1);
  // Resuming after block n needs the window behind position 4n.
  ASSERT_TRUE(kv->AttachWindow(t, 12, 16).ok());  // block 3
  EXPECT_EQ(kv->ResumablePrefix(t, 4), 4);        // from 16: window 11..16, blocks 2 and 3
  EXPECT_EQ(kv->ResumablePrefix(t, 3), 0);        // from 12: window 7..12 needs block 1
  EXPECT_EQ(kv->num_free_window(), 3);
  // Freeing a block frees its window storage.
  kv->Release(t[1]);
  kv->Release(t);
  EXPECT_EQ(kv->num_free(), 10);
  EXPECT_EQ(kv->num_free_window(), 5);
}

TEST(KvCacheTest, RefusesBadShapes) {
  KvCacheShape s = Shape();
  s.num_blocks = 0;
  EXPECT_FALSE(PagedKvCache::Create(s).ok());
}

}  // namespace
}  // namespace tandem::engine
