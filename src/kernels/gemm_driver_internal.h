// Internal header (kernels only). The tiled GEMM loop that every vector ISA shares: weight rows
// are packed kTileRows at a time into a per-thread tile (ISA-specific layout), then a
// microkernel multiplies the tile by up to kMaxCols activation rows at once. Activation rows
// are taken in chunks of about kActChunkBytes so that one pass over a tile's partners stays
// in L2. Instantiated inside each ISA's translation unit (compiled with its flags); the Layout
// type differs per ISA, so instantiations never collide.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels::internal {

inline constexpr int64_t kActChunkBytes = 384 << 10;  // activation bytes per pass (L2-sized)
inline constexpr int64_t kPrefetchTiles = 4;          // how far ahead weight rows are prefetched

inline bool IsFloatType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Prefetches the source rows kPrefetchTiles tiles past tile rr (clipped to r1), ahead of the
// hardware prefetcher, which stops at page boundaries. (The AVX-512 path's decode kernel, which
// streams the weights once, spreads its prefetches over the computation instead: dot_avx512.cc.)
template <int kTileRows>
inline void PrefetchRowsAhead(const uint8_t* src, int64_t src_row_bytes, int64_t rr, int64_t r1) {
  const int64_t ahead = rr + kPrefetchTiles * kTileRows;
  const int64_t rows = std::min<int64_t>(kTileRows, r1 - ahead);
  const uint8_t* next = src + ahead * src_row_bytes;
  for (int64_t off = 0; off < rows * src_row_bytes; off += 64) __builtin_prefetch(next + off);
}

// The ISA's pieces. Kernel: y[c * ldy + r] for tile rows r < nr (of kTileRows) and nc = index+1
// activation rows starting at act; Pack: one weight row of k elements into tile_row_bytes.
template <typename Layout>
struct GemmParts {
  using KernelFn = void (*)(const uint8_t* tile, int64_t tile_row_bytes, const uint8_t* act,
                            int64_t act_row_bytes, const Layout& layout, float* y, int64_t ldy,
                            int nr);
  using PackFn = void (*)(DType t, const uint8_t* src, int64_t k, uint8_t* dst);
  const Layout& layout;
  int64_t tile_row_bytes;
  const KernelFn* kernels;  // kMaxCols entries, by number of activation rows - 1
  PackFn pack;
};

// For r in [r0, r1), c in [0, m): y[c * ldy + r] = dot(weight row r, activation row c), with the
// activation rows act_row_bytes apart (IsaImpl::gemm's contract).
template <int kTileRows, int kMaxCols, typename Layout>
void TiledGemm(const GemmParts<Layout>& parts, const WeightView& w, const uint8_t* act,
               int64_t act_row_bytes, int64_t m, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const DType t = w.dtype;
  const int64_t k = w.cols;
  const int64_t src_row_bytes = RowBytes(t, k);
  const int64_t tile_row_bytes = parts.tile_row_bytes;
  uint8_t* tile = ThreadScratch(1, kTileRows * tile_row_bytes);
  const int64_t chunk =
      std::max<int64_t>(kMaxCols, kActChunkBytes / act_row_bytes / kMaxCols * kMaxCols);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t c0 = 0; c0 < m; c0 += chunk) {
    const int64_t c1 = std::min(m, c0 + chunk);
    for (int64_t rr = r0; rr < r1; rr += kTileRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - rr));
      if (c0 == 0) PrefetchRowsAhead<kTileRows>(src, src_row_bytes, rr, r1);
      for (int i = 0; i < kTileRows; ++i) {
        uint8_t* dst = tile + i * tile_row_bytes;
        if (i < nr) {
          parts.pack(t, src + (rr + i) * src_row_bytes, k, dst);
        } else {
          std::memset(dst, 0, tile_row_bytes);
        }
      }
      for (int64_t c = c0; c < c1; c += kMaxCols) {
        const int nc = static_cast<int>(std::min<int64_t>(kMaxCols, c1 - c));
        parts.kernels[nc - 1](tile, tile_row_bytes, act + c * act_row_bytes, act_row_bytes,
                              parts.layout, y + c * ldy + rr, ldy, nr);
      }
    }
  }
}

}  // namespace tandem::kernels::internal
