// Internal header (kernels only). The per-instruction-set table behind every SIMD kernel:
// matmul.cc (dispatch, threading), attention.cc and activations.cc call through it; the
// implementations live in dot_scalar.cc, dot_avx2.cc, dot_avx512.cc, attention_*.cc and
// activations_*.cc. cpu_isa.cc picks the table (one switch for the whole process).
//
// MatMul converts each activation row once per call into an ISA-private layout of
// act_row_bytes(w.dtype, k) bytes (a multiple of 64), then runs gemm over ranges of output rows
// on the pool's threads. Each ISA reproduces the same activation quantization numerics (see
// quant_blocks_internal.h), so all paths agree up to float summation order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"

namespace tandem::kernels::internal {

struct IsaImpl {
  const char* name;
  // Bytes of one converted activation row (multiple of 64) for weight type wtype, k columns.
  int64_t (*act_row_bytes)(DType wtype, int64_t k);
  // Converts one activation row x[k] into dst (act_row_bytes bytes, 64-byte aligned).
  void (*quantize_act)(DType wtype, const float* x, int64_t k, uint8_t* dst);
  // For r in [r0, r1), c in [0, m): y[c * ldy + r] = dot(weight row r, activation row c).
  // act holds m converted rows, act_row_bytes apart.
  void (*gemm)(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
               int64_t r0, int64_t r1, float* y, int64_t ldy);
  // kernels/activations.h SiluMul.
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  // kernels/activations.h GeluMul.
  void (*gelu_mul)(float* gate, const float* up, int64_t n);
  // kernels/activations.h RoundToFp16.
  void (*round_to_fp16)(float* x, int64_t n);
  // kernels/activations.h ExpSum.
  double (*exp_sum)(const float* x, float shift, float scale, float* out, int64_t n);
  // kernels/attention.h AttendTile (falls back to the scalar path for shapes it lacks).
  void (*attend_tile)(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride);
  // quantize_act and gemm for weights in the rows16 layout (interleaved_internal.h; the
  // activation row is Rows16ActRowBytes(k) bytes whatever the ISA).
  void (*rows16_quantize_act)(const float* x, int64_t k, uint8_t* dst);
  void (*rows16_gemm)(const WeightView& w, const uint8_t* act, int64_t act_row_bytes, int64_t m,
                      int64_t r0, int64_t r1, float* y, int64_t ldy);
};

// The table in use (forced or detected; cpu_isa.cc).
const IsaImpl* CurrentIsa();

const IsaImpl* ScalarIsa();
const IsaImpl* Avx2Isa();
const IsaImpl* Avx512Isa();
// The avx512 table with AMX-BF16 attention (attention_amx.cc); needs AMX-BF16 granted.
const IsaImpl* AmxIsa();

// Kernels the tables share or point at.

constexpr int kMaxAttentionRows = kMaxAttentionTile * kMaxAttentionGroup;

void SiluMulAvx2(float* gate, const float* up, int64_t n);
void GeluMulAvx2(float* gate, const float* up, int64_t n);
void RoundToFp16Avx2(float* x, int64_t n);
void SiluMulAvx512(float* gate, const float* up, int64_t n);
void GeluMulAvx512(float* gate, const float* up, int64_t n);
void RoundToFp16Avx512(float* x, int64_t n);
double ExpSumAvx2(const float* x, float shift, float scale, float* out, int64_t n);
double ExpSumAvx512(const float* x, float shift, float scale, float* out, int64_t n);
// (65,536) GeLU values by fp16 bit pattern of the input, each rounded to fp16 (activations.cc).
const float* GeluTable();
// The end of every attention kernel: normalized rows into out, or a.partial's raw form
// (kernels/attention.h). acc: (n_tokens * group, head_dim), st: n_tokens * group.
void StoreAttentionRows(const AttentionTile& a, const float* acc, const AttentionRowState* st,
                        int n_tokens, float* out, int64_t out_stride);
void AttendTileScalar(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride);
void AttendTileAvx2(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                    int64_t q_stride, float* out, int64_t out_stride);
void AttendTileAvx512(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                      int64_t q_stride, float* out, int64_t out_stride);
void AttendTileAmx(const AttentionTile& a, int first_pos, int n_tokens, const float* q,
                   int64_t q_stride, float* out, int64_t out_stride);

// A growable, 64-byte aligned buffer private to the calling thread; `slot` tells independent
// buffers apart (0: activations in MatMul, 1: weight tiles in gemm). Contents are not kept
// across calls that ask for a larger size.
uint8_t* ThreadScratch(int slot, size_t bytes);

inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace tandem::kernels::internal
