// Format tests: type table, quantize -> dequantize round trips, hand-made blocks decoded
// against hand-computed values, activation quantization semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant_blocks_internal.h"

namespace tandem::kernels {
namespace {

std::vector<float> RandomRow(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> RoundTrip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(RowBytes(t, static_cast<int64_t>(x.size())));
  QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  DequantizeRow(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

// Root-mean-square error relative to the root-mean-square of x.
double RelRmse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
    s += x[i] * static_cast<double>(x[i]);
  }
  return std::sqrt(e / s);
}

TEST(TypesTest, Table) {
  EXPECT_EQ(DTypeFromGguf(3), DType::kQ4_1);
  EXPECT_EQ(DTypeFromGguf(30), DType::kBF16);
  EXPECT_EQ(DTypeFromGguf(6), DType::kQ5_0);
  EXPECT_FALSE(DTypeFromGguf(7).has_value());  // Q5_1: not supported
  EXPECT_EQ(RowBytes(DType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(DType::kQ4_1, 64), 40);
  EXPECT_EQ(RowBytes(DType::kQ5_0, 64), 44);
  EXPECT_EQ(RowBytes(DType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(DType::kQ4_K, 512), 288);
  EXPECT_EQ(RowBytes(DType::kQ6_K, 256), 210);
  EXPECT_EQ(RowBytes(DType::kQ8_K, 256), 292);
  EXPECT_EQ(RowBytes(DType::kF16, 10), 20);
  EXPECT_STREQ(GetDTypeInfo(DType::kQ6_K).name, "Q6_K");
  EXPECT_STREQ(GetDTypeInfo(DType::kQ5_0).name, "Q5_0");
  EXPECT_EQ(GetDTypeInfo(DType::kQ5_0).block_elems, 32);
}

TEST(QuantizeTest, FloatTypesRoundTrip) {
  const auto x = RandomRow(1000, 1);
  EXPECT_EQ(RoundTrip(DType::kF32, x), x);
  const auto h = RoundTrip(DType::kF16, x);
  const auto b = RoundTrip(DType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(h[i], x[i], std::fabs(x[i]) * 0x1p-11 + 1e-7) << i;
    EXPECT_NEAR(b[i], x[i], std::fabs(x[i]) * 0x1p-8) << i;
  }
}

// Per-block bounds for the 32-element formats: half a step (one step for Q4_0 / Q5_0, whose
// range is asymmetric: -max maps to 8 / 16 steps and is clamped to 7 / 15), plus fp16 rounding
// of the scale / min. For Q4_0 / Q5_0 that rounding moves an element by at most 8 / 16 steps times
// |d| 2^-11 = amax 2^-11, inside the 1% margin (amax 0.00125 / 0.000625).
TEST(QuantizeTest, Block32RoundTrip) {
  const auto x = RandomRow(32 * 64, 2);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0, DType::kQ8_1}) {
    const auto y = RoundTrip(t, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float mn = x[32 * b], mx = x[32 * b], amax = 0;
      for (int j = 0; j < 32; ++j) {
        mn = std::min(mn, x[32 * b + j]);
        mx = std::max(mx, x[32 * b + j]);
        amax = std::max(amax, std::fabs(x[32 * b + j]));
      }
      float bound = 0;
      if (t == DType::kQ4_0) bound = amax / 8 * 1.01f;
      if (t == DType::kQ5_0) bound = amax / 16 * 1.01f;
      if (t == DType::kQ4_1) bound = (mx - mn) / 15 * 0.51f + std::fabs(mn) * 0x1p-10f;
      if (t == DType::kQ8_0 || t == DType::kQ8_1) bound = amax / 127 * 0.51f + amax * 0x1p-10f;
      for (int j = 0; j < 32; ++j) {
        ASSERT_NEAR(y[32 * b + j], x[32 * b + j], bound)
            << GetDTypeInfo(t).name << " block " << b << " elem " << j;
      }
    }
  }
}

// Q5_0 follows ggml's quantize_row_q5_0_ref exactly: d = max / -16 (max: the first value of
// largest magnitude, sign kept), q = min(31, trunc(x / d + 16.5)), low nibbles in qs (element
// j < 16 low, j + 16 high), fifth bits in qh (bit j, little-endian).
TEST(QuantizeTest, Q5_0MatchesGgmlReference) {
  std::vector<float> x(64, 0.0f);
  // Block 0: max = -16, so d = 1 and x / d + 16.5 is exact.
  x[0] = -16.0f;  // 0.5 -> q 0
  x[1] = 16.0f;   // 32.5 -> 32, clamped to 31 (decodes to 15)
  x[2] = 0.5f;    // 17.0 -> 17
  x[3] = -0.5f;   // 16.0 -> 16
  x[4] = 2.49f;   // 18.99 -> 18 (truncation)
  x[5] = -2.5f;   // 14.0 -> 14: halves round up
  x[6] = -15.9f;  // 0.6 -> 0
  x[17] = 7.5f;   // 24: high nibble 8 of qs[1], bit 17 set
  x[20] = -7.6f;  // 8.9 -> 8: high nibble 8 of qs[4], bit 20 clear
  x[31] = 16.0f;  // as large as x[0]: the first one sets max (else d would be -1)
  // Block 1: max = +8 (positive), so d = -0.5 and q = 16.5 - 2x.
  x[32] = 8.0f;   // 0.5 -> 0 (decodes to 8)
  x[33] = -8.0f;  // 32.5 -> 31 (decodes to -7.5)
  x[34] = 1.0f;   // 14.5 -> 14
  BlockQ5_0 b[2];
  QuantizeRow(DType::kQ5_0, x.data(), b, 64);
  EXPECT_EQ(b[0].d, 0x3C00);  // 1.0
  EXPECT_EQ(b[1].d, 0xB800);  // -0.5
  int q[64];
  for (int j = 0; j < 32; ++j) {
    q[j] = Q5_0Value(b[0], j);
    q[32 + j] = Q5_0Value(b[1], j);
  }
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 31);
  EXPECT_EQ(q[2], 17);
  EXPECT_EQ(q[3], 16);
  EXPECT_EQ(q[4], 18);
  EXPECT_EQ(q[5], 14);
  EXPECT_EQ(q[6], 0);
  EXPECT_EQ(q[7], 16);  // zeros: trunc(16.5)
  EXPECT_EQ(q[17], 24);
  EXPECT_EQ(q[20], 8);
  EXPECT_EQ(q[31], 31);
  EXPECT_EQ(q[32], 0);
  EXPECT_EQ(q[33], 31);
  EXPECT_EQ(q[34], 14);
  // The raw bytes: q[1] = 31 and q[17] = 24 share qs[1]; of qh bits 0-4, 17 and 31, all but
  // bit 0 are set.
  EXPECT_EQ(b[0].qs[1], 0x8F);
  uint32_t qh;
  std::memcpy(&qh, b[0].qh, 4);
  uint32_t want_qh = 0;
  for (int j = 0; j < 32; ++j) want_qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  EXPECT_EQ(qh, want_qh);
  EXPECT_EQ(qh & 0x8002001Fu, 0x8002001Eu);
  float y[64];
  DequantizeRow(DType::kQ5_0, b, y, 64);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[1], 15.0f);
  EXPECT_EQ(y[5], -2.0f);
  EXPECT_EQ(y[32], 8.0f);
  EXPECT_EQ(y[33], -7.5f);
  // An all-zero block: d = 0, every q = 16, every value 0.
  std::vector<float> z(32, 0.0f);
  for (float v : RoundTrip(DType::kQ5_0, z)) EXPECT_EQ(v, 0.0f);
}

TEST(QuantizeTest, KQuantRoundTrip) {
  const auto x = RandomRow(256 * 16, 3);
  EXPECT_LT(RelRmse(x, RoundTrip(DType::kQ4_K, x)), 0.12);
  EXPECT_LT(RelRmse(x, RoundTrip(DType::kQ6_K, x)), 0.03);
  EXPECT_LT(RelRmse(x, RoundTrip(DType::kQ8_K, x)), 0.01);
  // Constant and all-zero super-blocks stay exact-ish.
  std::vector<float> z(512, 0.0f);
  for (DType t : {DType::kQ4_K, DType::kQ6_K, DType::kQ8_K}) {
    for (float v : RoundTrip(t, z)) EXPECT_EQ(v, 0.0f) << GetDTypeInfo(t).name;
  }
}

TEST(DequantizeTest, HandMadeQ4_0AndQ8_0) {
  BlockQ4_0 b4{};
  b4.d = 0x4000;  // 2.0
  for (int j = 0; j < 16; ++j) b4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(DType::kQ4_0, &b4, y, 32);
  EXPECT_EQ(y[0], -16.0f);   // (0 - 8) * 2
  EXPECT_EQ(y[15], 14.0f);   // (15 - 8) * 2
  EXPECT_EQ(y[16], 14.0f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -16.0f);  // high nibble of qs[15] = 0
  BlockQ8_0 b8{};
  b8.d = 0x3400;  // 0.25
  for (int j = 0; j < 32; ++j) b8.qs[j] = static_cast<int8_t>(j * 8 - 128);
  DequantizeRow(DType::kQ8_0, &b8, y, 32);
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[31], (31 * 8 - 128) * 0.25f);
}

TEST(DequantizeTest, HandMadeQ5_0) {
  BlockQ5_0 b{};
  b.d = 0x3800;                     // 0.5
  const uint32_t qh = 0xA5C3F00Fu;  // fifth bits: element j has bit j
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(DType::kQ5_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    const int q0 = j | static_cast<int>(((qh >> j) & 1) << 4);
    const int q1 = (15 - j) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    ASSERT_EQ(y[j], (q0 - 16) * 0.5f) << j;
    ASSERT_EQ(y[j + 16], (q1 - 16) * 0.5f) << j + 16;
  }
  EXPECT_EQ(y[0], 0.0f);    // nibble 0, bit 0 set: q 16
  EXPECT_EQ(y[4], -6.0f);   // nibble 4, bit 4 clear: q 4
  EXPECT_EQ(y[15], 7.5f);   // nibble 15, bit 15 set: q 31
  EXPECT_EQ(y[16], 7.5f);   // high nibble of qs[0] = 15, bit 16 set: q 31
  EXPECT_EQ(y[18], -1.5f);  // high nibble of qs[2] = 13, bit 18 clear: q 13
  EXPECT_EQ(y[31], 0.0f);   // high nibble of qs[15] = 0, bit 31 set: q 16
}

TEST(DequantizeTest, HandMadeQ4_1) {
  BlockQ4_1 b{};
  b.d = 0x3800;  // 0.5
  b.m = 0xBC00;  // -1.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(DType::kQ4_1, &b, y, 32);
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[3], 0.5f);    // 3 * 0.5 - 1
  EXPECT_EQ(y[15], 6.5f);   // 15 * 0.5 - 1
  EXPECT_EQ(y[16], 6.5f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[20], 4.5f);   // high nibble of qs[4] = 11
  EXPECT_EQ(y[31], -1.0f);  // high nibble of qs[15] = 0
}

// Q4_K: scales/mins packed by hand with the 6-bit layout (j < 4: low 6 bits of bytes j / j+4;
// j >= 4: low / high nibble of byte j+4, top 2 bits from bits 6-7 of bytes j-4 / j).
TEST(DequantizeTest, HandMadeQ4_K) {
  const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
  const int mn[8] = {0, 7, 63, 9, 21, 40, 2, 60};
  BlockQ4_K b{};
  b.d = 0x3C00;     // 1.0
  b.dmin = 0x3800;  // 0.5
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | (((i * 7) % 16) << 4));
  float y[256];
  DequantizeRow(DType::kQ4_K, &b, y, 256);
  // Element e: chunk c = e / 64; first 32 of the chunk use low nibbles of qs[32c + l] with
  // sub-block 2c, the next 32 high nibbles with sub-block 2c + 1.
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, l = e % 32, hi = (e % 64) / 32, j = 2 * c + hi;
    const uint8_t byte = b.qs[32 * c + l];
    const int q = hi ? byte >> 4 : byte & 0xF;
    ASSERT_EQ(y[e], 1.0f * sc[j] * q - 0.5f * mn[j]) << e;
  }
  EXPECT_EQ(y[0], 0.0f);                    // q 0, sc 1, m 0
  EXPECT_EQ(y[33], 2.0f * 7 - 3.5f);        // qs[1] high nibble 7, sub-block 1
  EXPECT_EQ(y[200], 48.0f * 8 - 0.5f * 2);  // chunk 3, l 8: qs[104] low nibble 8, sub-block 6
  EXPECT_EQ(y[255], 5.0f * 9 - 30.0f);      // qs[127] high nibble (127*7)%16 = 9, sub-block 7
}

TEST(DequantizeTest, HandMadeQ6_K) {
  BlockQ6_K b{};
  b.d = 0x3400;  // 0.25
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j - 8);
  for (int i = 0; i < 128; ++i) b.ql[i] = static_cast<uint8_t>((i * 5 + 3) & 0xFF);
  for (int i = 0; i < 64; ++i) b.qh[i] = static_cast<uint8_t>((i * 37 + 11) & 0xFF);
  float y[256];
  DequantizeRow(DType::kQ6_K, &b, y, 256);
  // Element e: half n, quarter t (32 elements each), l = position in the quarter.
  // Low 4 bits: ql[64n + l + 32 (t odd)], low nibble for t < 2 else high nibble.
  // High 2 bits: bits 2t..2t+1 of qh[32n + l]. Scale: 8n + l/16 + 2t.
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, t = (e % 128) / 32, l = e % 32;
    const uint8_t lb = b.ql[64 * n + l + 32 * (t % 2)];
    const int lo = t < 2 ? lb & 0xF : lb >> 4;
    const int hb = (b.qh[32 * n + l] >> (2 * t)) & 3;
    const int q = (lo | (hb << 4)) - 32;
    ASSERT_EQ(y[e], 0.25f * b.scales[8 * n + l / 16 + 2 * t] * q) << e;
  }
  // Element 0: ql[0] = 3 (low 3), qh[0] = 11 = 0b1011 (bits 0-1 = 3) -> q = 51 - 32 = 19, sc -8.
  EXPECT_EQ(y[0], 0.25f * -8 * 19);
  // Element 64 (t = 2): ql[0] high nibble 0, qh[0] bits 4-5 = 0 -> q = -32, sc[4] = -4.
  EXPECT_EQ(y[64], 0.25f * -4 * -32);
}

// Activation quantization follows llama.cpp on x86: scale 127/amax, round half to even.
TEST(ActivationQuantTest, Q8_0AndQ8_1) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax 127: multiplier exactly 1
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -126.6f;
  BlockQ8_1 b{};
  QuantizeRow(DType::kQ8_1, x.data(), &b, 32);
  EXPECT_EQ(H2F(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 4);
  EXPECT_EQ(b.qs[3], -2);
  EXPECT_EQ(b.qs[4], -127);
  EXPECT_EQ(H2F(b.s), 127.0f + 2 + 4 - 2 - 127);
  BlockQ8_0 b0{};
  QuantizeRow(DType::kQ8_0, x.data(), &b0, 32);
  EXPECT_EQ(0, std::memcmp(b0.qs, b.qs, 32));
}

TEST(ActivationQuantTest, Q8_K) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(i % 17) - 4.0f;
  x[100] = -25.4f;  // largest magnitude, negative: iscale = 127 / 25.4 = 5
  BlockQ8_K b{};
  QuantizeRow(DType::kQ8_K, x.data(), &b, 256);
  EXPECT_FLOAT_EQ(b.d, 25.4f / 127.0f);
  EXPECT_EQ(b.qs[100], -127);
  EXPECT_EQ(b.qs[0], -20);  // -4 * 5
  EXPECT_EQ(b.qs[16], 60);  // 12 * 5
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
    EXPECT_EQ(b.bsums[j], sum);
  }
}

}  // namespace
}  // namespace tandem::kernels
