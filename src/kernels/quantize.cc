// Scalar quantization and dequantization of every supported type (ggml block formats), and the
// scalar activation quantizers whose numerics every ISA path reproduces.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels {
namespace {

// ---- weights (ggml reference semantics where it matters for the format) ----

// The value of largest magnitude among x[0..n), with its sign (the first one on ties).
float SignedAbsMax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Q4_0: d = max / -8 where max is the signed value of largest magnitude; q = x/d + 8.
void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, x += kQK) {
    const float max = SignedAbsMax(x, kQK);
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q5_0 (quantize_row_q5_0_ref): d = max / -16 with max the signed value of largest magnitude;
// q = min(31, trunc(x/d + 16.5)), so -max lands on 32 and is clamped to 31 (one step off).
void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, x += kQK) {
    const float max = SignedAbsMax(x, kQK);
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// Q4_1: m = min, d = (max - min) / 15, q = (x - m) / d.
void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, x += kQK) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < kQK; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    y[i].m = F2H(mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q4_K with a simple (not optimal) scale choice: per sub-block scale = (max - min') / 15 with
// min' = min(min, 0), then 6-bit quantization of scales and mins against the super-block maxima.
void QuantizeQ4_K(const float* x, BlockQ4_K* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i, x += kQKK) {
    float scale[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float mn = 0, mx = x[32 * j];
      for (int l = 0; l < 32; ++l) {
        mn = std::min(mn, x[32 * j + l]);
        mx = std::max(mx, x[32 * j + l]);
      }
      scale[j] = std::max(0.0f, mx - mn) / 15;
      mins[j] = -mn;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63 / max_scale : 0;
    const float inv_min = max_min > 0 ? 63 / max_min : 0;
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(std::min(63, NearestInt(inv_scale * scale[j])));
      m[j] = static_cast<uint8_t>(std::min(63, NearestInt(inv_min * mins[j])));
    }
    BlockQ4_K& b = y[i];
    std::memset(b.scales, 0, sizeof(b.scales));
    for (int j = 0; j < 8; ++j) {
      if (j < 4) {
        b.scales[j] = sc[j];
        b.scales[j + 4] = m[j];
      } else {
        b.scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
        b.scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
        b.scales[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
      }
    }
    b.d = F2H(max_scale / 63);
    b.dmin = F2H(max_min / 63);
    const float d = H2F(b.d), dmin = H2F(b.dmin);
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      const float dd = d * sc[j], dm = dmin * m[j];
      for (int l = 0; l < 32; ++l) {
        const int v = dd != 0 ? NearestInt((x[32 * j + l] + dm) / dd) : 0;
        q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0, 15));
      }
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

// Q6_K: per 16, scale = max / -32 (max = signed value of largest magnitude); scales quantized
// to int8 against the largest one; q = x / (d * sc) + 32 clamped to 0..63.
void QuantizeQ6_K(const float* x, BlockQ6_K* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i, x += kQKK) {
    float scale[16];
    float max_scale = 0, amax_scale = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0, max = 0;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(x[16 * j + l]) > amax) {
          amax = std::fabs(x[16 * j + l]);
          max = x[16 * j + l];
        }
      }
      scale[j] = max / -32;
      if (std::fabs(scale[j]) > amax_scale) {
        amax_scale = std::fabs(scale[j]);
        max_scale = scale[j];
      }
    }
    BlockQ6_K& b = y[i];
    if (amax_scale == 0) {
      std::memset(&b, 0, sizeof(b));  // d = 0: every element decodes to 0
      continue;
    }
    const float iscale = -128 / max_scale;
    for (int j = 0; j < 16; ++j) {
      b.scales[j] = static_cast<int8_t>(std::clamp(NearestInt(iscale * scale[j]), -128, 127));
    }
    b.d = F2H(1 / iscale);
    const float d = H2F(b.d);
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const float dd = d * b.scales[j];
      for (int l = 0; l < 16; ++l) {
        const int v = dd != 0 ? NearestInt(x[16 * j + l] / dd) : 0;
        q[16 * j + l] = static_cast<uint8_t>(std::clamp(v, -32, 31) + 32);
      }
    }
    for (int n = 0; n < 2; ++n) {
      uint8_t* ql = b.ql + 64 * n;
      uint8_t* qh = b.qh + 32 * n;
      const uint8_t* L = q + 128 * n;
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[l], q2 = L[l + 32], q3 = L[l + 64], q4 = L[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                     ((q4 >> 4) << 6));
      }
    }
  }
}

// ---- dequantization ----

void DequantQ4_0(const BlockQ4_0* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, y += kQK) {
    const float d = H2F(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const BlockQ4_1* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, y += kQK) {
    const float d = H2F(x[i].d), m = H2F(x[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = (x[i].qs[j] & 0xF) * d + m;
      y[j + 16] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}

void DequantQ5_0(const BlockQ5_0* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, y += kQK) {
    const float d = H2F(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = (Q5_0Value(x[i], j) - 16) * d;
  }
}

template <typename Block>
void DequantQ8(const Block* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i, y += kQK) {
    const float d = H2F(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = x[i].qs[j] * d;
  }
}

void DequantQ4_K(const BlockQ4_K* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c, q += 32, y += 64) {
      uint8_t sc, m;
      GetScaleMinK4(2 * c, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(2 * c + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[l + 32] = d2 * (q[l] >> 4) - m2;
    }
  }
}

void DequantQ6_K(const BlockQ6_K* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const float d = H2F(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void DequantQ8_K(const BlockQ8_K* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i, y += kQKK) {
    for (int j = 0; j < kQKK; ++j) y[j] = x[i].d * x[i].qs[j];
  }
}

// Shared by Q8_0 and Q8_1: returns d (unrounded) and writes q.
float QuantizeQ8Block(const float* x, int8_t* q) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = amax != 0 ? 127 / amax : 0;
  for (int j = 0; j < kQK; ++j) q[j] = static_cast<int8_t>(NearestInt(x[j] * id));
  return d;
}

}  // namespace

void QuantizeActQ8_0(const float* x, BlockQ8_0* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i) y[i].d = F2H(QuantizeQ8Block(x + i * kQK, y[i].qs));
}

void QuantizeActQ8_1(const float* x, BlockQ8_1* y, int64_t k) {
  for (int64_t i = 0; i < k / kQK; ++i) {
    const float d = QuantizeQ8Block(x + i * kQK, y[i].qs);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) sum += y[i].qs[j];
    y[i].d = F2H(d);
    y[i].s = F2H(d * static_cast<float>(sum));
  }
}

void QuantizeActQ8_K(const float* x, BlockQ8_K* y, int64_t k) {
  for (int64_t i = 0; i < k / kQKK; ++i, x += kQKK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[i], 0, sizeof(y[i]));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * x[j])));
    }
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  TANDEM_CHECK(n % GetDTypeInfo(t).block_elems == 0) << GetDTypeInfo(t).name << " n=" << n;
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return;
    }
    case DType::kQ4_0: QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), n); return;
    case DType::kQ4_1: QuantizeQ4_1(src, static_cast<BlockQ4_1*>(dst), n); return;
    case DType::kQ5_0: QuantizeQ5_0(src, static_cast<BlockQ5_0*>(dst), n); return;
    case DType::kQ8_0: QuantizeActQ8_0(src, static_cast<BlockQ8_0*>(dst), n); return;
    case DType::kQ8_1: QuantizeActQ8_1(src, static_cast<BlockQ8_1*>(dst), n); return;
    case DType::kQ4_K: QuantizeQ4_K(src, static_cast<BlockQ4_K*>(dst), n); return;
    case DType::kQ6_K: QuantizeQ6_K(src, static_cast<BlockQ6_K*>(dst), n); return;
    case DType::kQ8_K: QuantizeActQ8_K(src, static_cast<BlockQ8_K*>(dst), n); return;
  }
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  TANDEM_CHECK(n % GetDTypeInfo(t).block_elems == 0) << GetDTypeInfo(t).name << " n=" << n;
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return;
    }
    case DType::kQ4_0: DequantQ4_0(static_cast<const BlockQ4_0*>(src), dst, n); return;
    case DType::kQ4_1: DequantQ4_1(static_cast<const BlockQ4_1*>(src), dst, n); return;
    case DType::kQ5_0: DequantQ5_0(static_cast<const BlockQ5_0*>(src), dst, n); return;
    case DType::kQ8_0: DequantQ8(static_cast<const BlockQ8_0*>(src), dst, n); return;
    case DType::kQ8_1: DequantQ8(static_cast<const BlockQ8_1*>(src), dst, n); return;
    case DType::kQ4_K: DequantQ4_K(static_cast<const BlockQ4_K*>(src), dst, n); return;
    case DType::kQ6_K: DequantQ6_K(static_cast<const BlockQ6_K*>(src), dst, n); return;
    case DType::kQ8_K: DequantQ8_K(static_cast<const BlockQ8_K*>(src), dst, n); return;
  }
}

}  // namespace tandem::kernels
