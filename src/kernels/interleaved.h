// Weight matrices with their rows interleaved 16 at a time ("rows16"), a layout the AVX-512
// MatMul path reads faster than GGUF's.
//
// In GGUF a row's blocks lie one after another, so a kernel that reads one row at a time must
// gather each block's scale and quants from different places and reduce across SIMD lanes at the
// end. Interleaved, the same bytes are reordered so that one 64-byte load holds four quant bytes
// of 16 rows: int32 lane r of a vpdpbusd then belongs to row r, each block's 16 scales are one
// vector, and no horizontal reduction is left. The byte count is GGUF's (nothing is converted or
// widened), so decode still reads exactly the file's bytes; what it saves is instructions.
//
// Layout: panels of 16 rows, one after another; a panel holds its 16 rows' block 0, then block
// 1, ... (cols / 32 blocks). One block of a panel ("block column") is:
//   Q4_1: d[16] fp16, m[16] fp16, then 4 chunks of 64 bytes; in chunk s, bytes 4r..4r+3 are qs
//         bytes 4s..4s+3 of row r (low nibbles: elements 4s..4s+3, high: 16+4s..16+4s+3).
//         320 bytes = 16 x sizeof(block_q4_1).
//   Q8_0: d[16] fp16, then 8 chunks of 64 bytes; in chunk s, bytes 4r..4r+3 are qs 4s..4s+3 of
//         row r. 544 bytes = 16 x sizeof(block_q8_0).
// Results equal the GGUF path's up to float summation order, and are the same for every batch
// size and every instruction set (the scalar reference reproduces the AVX-512 arithmetic bit
// for bit), so batch invariance holds for interleaved weights as for GGUF ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "kernels/matmul.h"

namespace tandem::kernels {

inline constexpr int64_t kInterleaveRows = 16;

// Whether w (GGUF layout) can be interleaved and is worth it on this CPU: Q4_1 or Q8_0, rows a
// multiple of 16, and the AVX-512 path active (others would run the scalar reference).
bool ShouldInterleave(const WeightView& w);

// An interleaved copy of a GGUF matrix. Owns its buffer (64-byte aligned); view() points into
// it and stays valid while this object lives (moving it keeps the buffer where it is).
class InterleavedMatrix {
 public:
  // Called as the copy proceeds with the source bytes copied so far, [w.data, w.data + bytes)
  // (whole rows, growing), so that a mapped source can be dropped from memory behind the copy.
  using SourceDone = std::function<void(size_t bytes)>;
  // Copies w (GGUF layout, Q4_1 or Q8_0, rows a multiple of 16; anything else aborts).
  explicit InterleavedMatrix(const WeightView& w, const SourceDone& source_done = {});
  const WeightView& view() const { return view_; }

 private:
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeAligned> data_;
  WeightView view_{};
};

}  // namespace tandem::kernels
