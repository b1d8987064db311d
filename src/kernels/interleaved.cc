// Interleaving GGUF matrices into the rows16 layout, and the portable reference kernels on it.
#include "kernels/interleaved.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels {
namespace {

using internal::Rows16BlockBytes;

bool Interleavable(const WeightView& w) {
  return w.layout == WeightLayout::kGguf && (w.dtype == DType::kQ4_1 || w.dtype == DType::kQ8_0) &&
         w.rows > 0 && w.rows % kInterleaveRows == 0 && w.cols > 0 && w.cols % kQK == 0;
}

// Block column b of panel p, from the 16 GGUF rows starting at 16p.
template <typename Block>
void PackBlockColumn(const uint8_t* src, int64_t row_bytes, int64_t p, int64_t b, uint8_t* dst) {
  constexpr int kQsBytes = sizeof(Block::qs);
  constexpr int kHead = sizeof(Block) == sizeof(BlockQ4_1) ? 64 : 32;  // d[16] (and m[16])
  auto* d16 = reinterpret_cast<uint16_t*>(dst);
  for (int r = 0; r < kInterleaveRows; ++r) {
    Block blk;
    std::memcpy(&blk, src + (16 * p + r) * row_bytes + b * sizeof(Block), sizeof(Block));
    d16[r] = blk.d;
    if constexpr (kHead == 64) d16[16 + r] = blk.m;
    for (int s = 0; s < kQsBytes / 4; ++s) {
      std::memcpy(dst + kHead + 64 * s + 4 * r, reinterpret_cast<const uint8_t*>(blk.qs) + 4 * s,
                  4);
    }
  }
}

}  // namespace

bool ShouldInterleave(const WeightView& w) {
  // Worth it where the active ISA has its own rows16 kernel (not the scalar reference).
  return Interleavable(w) && internal::CurrentIsa()->rows16_gemm != internal::GemmRows16Scalar;
}

void InterleavedMatrix::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

InterleavedMatrix::InterleavedMatrix(const WeightView& w, const SourceDone& source_done) {
  TANDEM_CHECK(Interleavable(w)) << "InterleavedMatrix: " << GetDTypeInfo(w.dtype).name << " "
                                 << w.rows << "x" << w.cols << " cannot be interleaved";
  const int64_t row_bytes = RowBytes(w.dtype, w.cols);
  const int64_t bytes = row_bytes * w.rows;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  TANDEM_CHECK(data_ != nullptr) << "InterleavedMatrix: out of memory for " << bytes << " bytes";
  const auto* src = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.cols / kQK, col_bytes = Rows16BlockBytes(w.dtype);
  constexpr int64_t kPanelsPerReport = 64;
  const int64_t panels = w.rows / kInterleaveRows;
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = data_.get() + (p * nb + b) * col_bytes;
      if (w.dtype == DType::kQ4_1) {
        PackBlockColumn<BlockQ4_1>(src, row_bytes, p, b, dst);
      } else {
        PackBlockColumn<BlockQ8_0>(src, row_bytes, p, b, dst);
      }
    }
    if (source_done && ((p + 1) % kPanelsPerReport == 0 || p + 1 == panels)) {
      source_done(static_cast<size_t>((p + 1) * kInterleaveRows * row_bytes));
    }
  }
  view_ = WeightView{w.dtype, w.rows, w.cols, data_.get(), WeightLayout::kRows16};
}

void DequantizeWeightRow(const WeightView& w, int64_t row, float* dst) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  if (w.layout == WeightLayout::kGguf) {
    DequantizeRow(w.dtype, data + row * RowBytes(w.dtype, w.cols), dst, w.cols);
    return;
  }
  // Rebuild each GGUF block of the row from its block column, then decode it.
  const bool q41 = w.dtype == DType::kQ4_1;
  const int64_t nb = w.cols / kQK, col_bytes = Rows16BlockBytes(w.dtype);
  const int64_t p = row / kInterleaveRows, lane = row % kInterleaveRows;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* col = data + (p * nb + b) * col_bytes;
    uint8_t blk[sizeof(BlockQ8_0)];
    const int head = q41 ? 4 : 2, qs_bytes = q41 ? 16 : 32;
    std::memcpy(blk, col + 2 * lane, 2);
    if (q41) std::memcpy(blk + 2, col + 32 + 2 * lane, 2);
    for (int s = 0; s < qs_bytes / 4; ++s) {
      std::memcpy(blk + head + 4 * s, col + (q41 ? 64 : 32) + 64 * s + 4 * lane, 4);
    }
    DequantizeRow(w.dtype, blk, dst + kQK * b, kQK);
  }
}

namespace internal {

void QuantizeActRows16Scalar(const float* x, int64_t k, uint8_t* dst) {
  const Rows16ActLayout L(k);
  std::vector<BlockQ8_1> blocks(L.nb);
  QuantizeActQ8_1(x, blocks.data(), k);
  auto* da = reinterpret_cast<float*>(dst + L.da());
  auto* sa = reinterpret_cast<float*>(dst + L.sa());
  auto* corr = reinterpret_cast<int32_t*>(dst + L.corr());
  for (int64_t b = 0; b < L.nb; ++b) {
    std::memcpy(dst + 32 * b, blocks[b].qs, 32);
    int sum = 0;
    for (int8_t q : blocks[b].qs) sum += q;
    da[b] = H2F(blocks[b].d);
    sa[b] = H2F(blocks[b].s);
    corr[b] = 128 * sum;
  }
  std::memset(dst + L.nb * 44, 0, L.bytes() - L.nb * 44);
}

void GemmRows16Scalar(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
                      int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const Rows16ActLayout L(w.cols);
  const bool q41 = w.dtype == DType::kQ4_1;
  const int64_t col_bytes = Rows16BlockBytes(w.dtype), head = q41 ? 64 : 32;
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t p = r / kInterleaveRows, lane = r % kInterleaveRows;
    for (int64_t c = 0; c < m; ++c) {
      const uint8_t* a = act + c * act_row_bytes;
      const auto* qa = reinterpret_cast<const int8_t*>(a);
      const auto* da = reinterpret_cast<const float*>(a + L.da());
      const auto* sa = reinterpret_cast<const float*>(a + L.sa());
      float acc = 0, macc = 0;
      for (int64_t b = 0; b < L.nb; ++b) {
        const uint8_t* blk = data + (p * L.nb + b) * col_bytes;
        uint16_t dw_bits, mw_bits;
        std::memcpy(&dw_bits, blk + 2 * lane, 2);
        int isum = 0;
        if (q41) {
          std::memcpy(&mw_bits, blk + 32 + 2 * lane, 2);
          for (int s = 0; s < 4; ++s) {
            for (int j = 0; j < 4; ++j) {
              const uint8_t byte = blk[head + 64 * s + 4 * lane + j];
              isum += (byte & 0xF) * qa[32 * b + 4 * s + j];
              isum += (byte >> 4) * qa[32 * b + 16 + 4 * s + j];
            }
          }
        } else {
          for (int s = 0; s < 8; ++s) {
            for (int j = 0; j < 4; ++j) {
              const auto q = static_cast<int8_t>(blk[head + 64 * s + 4 * lane + j]);
              isum += q * qa[32 * b + 4 * s + j];
            }
          }
        }
        const float scale = H2F(dw_bits) * da[b];
        acc = std::fma(static_cast<float>(isum), scale, acc);
        if (q41) macc = std::fma(H2F(mw_bits), sa[b], macc);
      }
      y[c * ldy + r] = q41 ? acc + macc : acc;
    }
  }
}

}  // namespace internal
}  // namespace tandem::kernels
