// ggml block layouts (internal). All little-endian; "half" fields are IEEE binary16 bits.
// These must match llama.cpp's ggml-common.h byte for byte: weights come straight from GGUF.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/fp16.h"

namespace tandem::kernels {

inline constexpr int kQK = 32;    // elements per Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q8_1 block
inline constexpr int kQKK = 256;  // elements per K-quant super-block

// x = (q - 8) * d, q = nibble. Element j (0..15) is the low nibble of qs[j], j+16 the high one.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
// x = q * d + m, same nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
// x = (q - 16) * d, q = 5 bits: the low 4 in nibbles as Q4_0 (element j < 16: low nibble of
// qs[j], j + 16: high nibble), the fifth is bit j of qh read as a little-endian uint32.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// x = q * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// x = q * d; s = d * sum(q) (activation type paired with Q4_1).
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};
// 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j]; sc/m are 6-bit, packed in scales[12]
// (see GetScaleMinK4). Sub-block 2c uses the low nibbles of qs[32c .. 32c+31], 2c+1 the high.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q = 6 bits (4 in ql, 2 in qh); see
// DequantizeRow for the bit positions.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// Activation type paired with K-quants: x = d * q; bsums[j] = sum of qs[16j .. 16j+15].
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

inline float H2F(uint16_t h) { return Fp16ToFp32(h); }
inline uint16_t F2H(float f) { return Fp32ToFp16(f); }
// Rounds a float to the nearest representable half and back.
inline float RoundToHalf(float f) { return Fp16ToFp32(Fp32ToFp16(f)); }

// Unpacks the 6-bit scale and min of Q4_K sub-block j (0..7).
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Round half to even, as ggml's nearest_int (valid for |f| < 2^22).
inline int NearestInt(float f) {
  const float v = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// The 5-bit value q (0..31) of element j (0..31) of a Q5_0 block.
inline int Q5_0Value(const BlockQ5_0& b, int j) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const int lo = j < 16 ? b.qs[j] & 0xF : b.qs[j - 16] >> 4;
  return lo | static_cast<int>(((qh >> j) & 1) << 4);
}

// The activation ("vec dot") type MatMul pairs with weight type t.
inline DType ActType(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0: return DType::kQ8_0;
    case DType::kQ4_1: return DType::kQ8_1;
    case DType::kQ4_K:
    case DType::kQ6_K: return DType::kQ8_K;
    default: return t;  // F32, F16, BF16
  }
}

// Scalar activation quantizers with llama.cpp's x86 semantics (bit-exact with its AVX2 path):
//   Q8_0/Q8_1: per 32, amax = max|x|, d = amax/127 (stored fp16), q = rne(x * (127/amax)),
//              Q8_1 s = fp16(d * sum(q)) with the unrounded float d.
//   Q8_K:      per 256, max = the x with largest |x| (first one), iscale = -127/max,
//              q = min(127, rne(iscale * x)), d = 1/iscale (float), bsums per 16.
void QuantizeActQ8_0(const float* x, BlockQ8_0* y, int64_t k);
void QuantizeActQ8_1(const float* x, BlockQ8_1* y, int64_t k);
void QuantizeActQ8_K(const float* x, BlockQ8_K* y, int64_t k);

}  // namespace tandem::kernels
