// Portable reference implementation of MatMul: activations are quantized into ggml's own
// block formats (block_q8_0 / q8_1 / q8_K, fp16, bf16, f32) and each output is one vec_dot in
// the style of ggml's generic kernels (integer sums per block, float accumulation per block).
#include <cstring>

#include "common/fp16.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels::internal {
namespace {

float DotQ4_0(const BlockQ4_0* w, const BlockQ8_0* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j];
      sumi += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
    }
    sumf += sumi * H2F(w[i].d) * H2F(a[i].d);
  }
  return sumf;
}

float DotQ4_1(const BlockQ4_1* w, const BlockQ8_1* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (w[i].qs[j] & 0xF) * a[i].qs[j];
      sumi += (w[i].qs[j] >> 4) * a[i].qs[j + 16];
    }
    sumf += (H2F(w[i].d) * H2F(a[i].d)) * sumi + H2F(w[i].m) * H2F(a[i].s);
  }
  return sumf;
}

float DotQ5_0(const BlockQ5_0* w, const BlockQ8_0* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += (Q5_0Value(w[i], j) - 16) * a[i].qs[j];
    sumf += sumi * (H2F(w[i].d) * H2F(a[i].d));
  }
  return sumf;
}

float DotQ8_0(const BlockQ8_0* w, const BlockQ8_0* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += w[i].qs[j] * a[i].qs[j];
    sumf += sumi * (H2F(w[i].d) * H2F(a[i].d));
  }
  return sumf;
}

// Per super-block: integer sum over sub-blocks of sc * sum(q * a), minus the mins term from
// the activation's 16-element sums; one float multiply-add per super-block.
float DotQ4_K(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      GetScaleMinK4(j, w[i].scales, &sc, &m);
      const uint8_t* q = w[i].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      const int8_t* qa = a[i].qs + 32 * j;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += ((q[l] >> shift) & 0xF) * qa[l];
      isum += sc * s;
      msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    sumf += H2F(w[i].d) * a[i].d * isum - H2F(w[i].dmin) * a[i].d * msum;
  }
  return sumf;
}

float DotQ6_K(const BlockQ6_K* w, const BlockQ8_K* a, int64_t nb) {
  float sumf = 0;
  int8_t q[256];
  for (int64_t i = 0; i < nb; ++i) {
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = w[i].ql + 64 * n;
      const uint8_t* qh = w[i].qh + 32 * n;
      int8_t* y = q + 128 * n;
      for (int l = 0; l < 32; ++l) {
        y[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        y[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        y[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        y[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[16 * j + l] * a[i].qs[16 * j + l];
      isum += w[i].scales[j] * s;
    }
    sumf += H2F(w[i].d) * a[i].d * isum;
  }
  return sumf;
}

float DotF32(const float* w, const float* a, int64_t k) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += static_cast<double>(w[i]) * a[i];
  return static_cast<float>(s);
}

template <float (*Cvt)(uint16_t)>
float DotHalf(const uint16_t* w, const uint16_t* a, int64_t k) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += static_cast<double>(Cvt(w[i])) * Cvt(a[i]);
  return static_cast<float>(s);
}

float VecDot(DType t, const void* w, const void* a, int64_t k) {
  switch (t) {
    case DType::kQ4_0:
      return DotQ4_0(static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a), k / kQK);
    case DType::kQ4_1:
      return DotQ4_1(static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a), k / kQK);
    case DType::kQ5_0:
      return DotQ5_0(static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a), k / kQK);
    case DType::kQ8_0:
      return DotQ8_0(static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a), k / kQK);
    case DType::kQ4_K:
      return DotQ4_K(static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a), k / kQKK);
    case DType::kQ6_K:
      return DotQ6_K(static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a), k / kQKK);
    case DType::kF32: return DotF32(static_cast<const float*>(w), static_cast<const float*>(a), k);
    case DType::kF16:
      return DotHalf<Fp16ToFp32>(static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
                                 k);
    case DType::kBF16:
      return DotHalf<Bf16ToFp32>(static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
                                 k);
    default: return 0;  // Q8_1 / Q8_K are activation-only types; MatMul rejects them.
  }
}

int64_t ActRowBytes(DType wtype, int64_t k) { return RoundUp(RowBytes(ActType(wtype), k), 64); }

void QuantizeAct(DType wtype, const float* x, int64_t k, uint8_t* dst) {
  switch (ActType(wtype)) {
    case DType::kQ8_0: QuantizeActQ8_0(x, reinterpret_cast<BlockQ8_0*>(dst), k); return;
    case DType::kQ8_1: QuantizeActQ8_1(x, reinterpret_cast<BlockQ8_1*>(dst), k); return;
    case DType::kQ8_K: QuantizeActQ8_K(x, reinterpret_cast<BlockQ8_K*>(dst), k); return;
    case DType::kF32: std::memcpy(dst, x, k * sizeof(float)); return;
    case DType::kF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < k; ++i) d[i] = Fp32ToFp16(x[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < k; ++i) d[i] = Fp32ToBf16(x[i]);
      return;
    }
    default: return;
  }
}

void Gemm(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m, int64_t r0,
          int64_t r1, float* y, int64_t ldy) {
  const int64_t row_bytes = RowBytes(w.dtype, w.cols);
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < m; ++c) {
      y[c * ldy + r] = VecDot(w.dtype, wdata + r * row_bytes, act + c * act_row_bytes, w.cols);
    }
  }
}

}  // namespace

const IsaImpl* ScalarIsa() {
  static const IsaImpl impl{"scalar",          ActRowBytes,
                            QuantizeAct,       Gemm,
                            SiluMulScalar,     GeluMulScalar,
                            RoundToFp16Scalar, ExpSumScalar,
                            AttendTileScalar,  QuantizeActRows16Scalar,
                            GemmRows16Scalar};
  return &impl;
}

}  // namespace tandem::kernels::internal
