// Internal header (kernels only): the activation format and the portable reference of MatMul on
// interleaved ("rows16") weights, whose layout kernels/interleaved.h describes.
//
// Activation row (Rows16ActRowBytes(k) bytes, a multiple of 64), nb = k / 32 blocks:
//   qa   s8 [nb * 32]  q, natural element order
//   da   f32[nb]       d rounded to fp16 (amax / 127, as the Q8_0 / Q8_1 activation quantizers)
//   sa   f32[nb]       fp16(d * sum q), d unrounded (ggml's Q8_1 s): Q4_1's min term
//   corr i32[nb]       128 * sum q: Q8_0's quants are read as unsigned q + 128, and this takes
//                      the bias back out of each block's integer sum
// The same row serves Q4_1 and Q8_0 weights (their activation q and d are the same).
//
// The arithmetic every path reproduces bit for bit (isum exact in int32, then float):
//   Q4_1: acc = fma(float(isum_b), dw_b * da_b, acc); macc = fma(mw_b, sa_b, macc) for each
//         block b in order, y = acc + macc
//   Q8_0: acc = fma(float(isum_b), dw_b * da_b, acc) for each block b in order, y = acc
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/matmul.h"

namespace tandem::kernels::internal {

// Bytes of one block column of a panel (16 rows x one block).
inline int64_t Rows16BlockBytes(DType t) { return t == DType::kQ4_1 ? 320 : 544; }

struct Rows16ActLayout {
  int64_t nb;  // blocks of 32
  explicit Rows16ActLayout(int64_t k) : nb(k / 32) {}
  int64_t da() const { return nb * 32; }
  int64_t sa() const { return nb * 36; }
  int64_t corr() const { return nb * 40; }
  int64_t bytes() const { return (nb * 44 + 63) / 64 * 64; }
};

inline int64_t Rows16ActRowBytes(int64_t k) { return Rows16ActLayout(k).bytes(); }

// Converts one activation row x[k] into dst (Rows16ActRowBytes(k) bytes).
void QuantizeActRows16Scalar(const float* x, int64_t k, uint8_t* dst);
void QuantizeActRows16Avx512(const float* x, int64_t k, uint8_t* dst);
// IsaImpl::gemm's contract for w.layout == kRows16 (any row range).
void GemmRows16Scalar(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
                      int64_t r0, int64_t r1, float* y, int64_t ldy);
void GemmRows16Avx512(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
                      int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace tandem::kernels::internal
