// MatMul entry point: instruction-set dispatch, activation conversion, threading.
#include "kernels/matmul.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/interleaved_internal.h"
#include "kernels/isa_internal.h"

namespace tandem::kernels {
namespace {

using internal::IsaImpl;

using internal::CurrentIsa;

bool IsWeightType(DType t) { return t != DType::kQ8_1 && t != DType::kQ8_K; }

// Each thread gets at least this many multiply-adds (a few us of work), so the pool's hand-off
// (about a microsecond with spinning workers) stays small; smaller calls run on fewer threads.
constexpr int64_t kMinWorkPerThread = 64 << 10;
constexpr int64_t kRowGrain = 16;  // output rows per scheduling unit (a multiple of 4)
constexpr int64_t kMinQuantizePerThread = 64 << 10;  // activation elements

}  // namespace

namespace internal {

uint8_t* ThreadScratch(int slot, size_t bytes) {
  thread_local std::vector<uint8_t> buffers[2];
  std::vector<uint8_t>& b = buffers[slot];
  if (b.size() < bytes + 64) b.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(b.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~static_cast<uintptr_t>(63));
}

}  // namespace internal

void MatMul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool* pool) {
  const MatMulOutput out{w, y};
  MatMulShared({&out, 1}, x, m, pool);
}

void MatMulShared(std::span<const MatMulOutput> outs, const float* x, int64_t m, ThreadPool* pool) {
  const auto n_outs = static_cast<int>(outs.size());
  if (m <= 0 || n_outs == 0) return;
  TANDEM_CHECK(n_outs <= kMaxSharedOutputs) << "MatMulShared: " << n_outs << " outputs";
  const int64_t k = outs[0].w.cols;
  const IsaImpl* isa = CurrentIsa();
  // Outputs whose weights share a dtype and layout share one converted activation matrix
  // ("format"); rows16 weights (Q4_1 and Q8_0 alike) share one format of their own.
  std::array<DType, kMaxSharedOutputs> format_type{};
  std::array<bool, kMaxSharedOutputs> format_rows16{};
  std::array<int64_t, kMaxSharedOutputs> format_offset{};  // bytes into the scratch buffer
  std::array<int64_t, kMaxSharedOutputs> format_row_bytes{};
  std::array<int, kMaxSharedOutputs> format_of{};          // by output
  std::array<int64_t, kMaxSharedOutputs + 1> first_row{};  // of each output in the joint range
  int n_formats = 0;
  int64_t scratch_bytes = 0;
  for (int o = 0; o < n_outs; ++o) {
    const WeightView& w = outs[o].w;
    TANDEM_CHECK(IsWeightType(w.dtype) && w.cols == k && k > 0 &&
                 k % GetDTypeInfo(w.dtype).block_elems == 0)
        << "MatMul: unsupported weight " << GetDTypeInfo(w.dtype).name << " with " << w.cols
        << " columns (expected " << k << ")";
    const bool rows16 = w.layout == WeightLayout::kRows16;
    TANDEM_CHECK(!rows16 || w.dtype == DType::kQ4_1 || w.dtype == DType::kQ8_0)
        << "MatMul: rows16 layout of " << GetDTypeInfo(w.dtype).name;
    int f = 0;
    while (f < n_formats &&
           (format_rows16[f] != rows16 || (!rows16 && format_type[f] != w.dtype))) {
      ++f;
    }
    if (f == n_formats) {
      format_type[f] = w.dtype;
      format_rows16[f] = rows16;
      format_offset[f] = scratch_bytes;
      format_row_bytes[f] =
          rows16 ? internal::Rows16ActRowBytes(k) : isa->act_row_bytes(w.dtype, k);
      scratch_bytes += m * format_row_bytes[f];
      ++n_formats;
    }
    format_of[o] = f;
    first_row[o + 1] = first_row[o] + std::max<int64_t>(0, w.rows);
  }
  const int64_t total_rows = first_row[n_outs];
  if (total_rows == 0) return;
  uint8_t* act = internal::ThreadScratch(0, static_cast<size_t>(scratch_bytes));
  const bool parallel = pool != nullptr && pool->num_threads() > 1;

  auto quantize = [&](int64_t begin, int64_t end, int) {
    for (int f = 0; f < n_formats; ++f) {
      for (int64_t i = begin; i < end; ++i) {
        uint8_t* dst = act + format_offset[f] + i * format_row_bytes[f];
        if (format_rows16[f]) {
          isa->rows16_quantize_act(x + i * k, k, dst);
        } else {
          isa->quantize_act(format_type[f], x + i * k, k, dst);
        }
      }
    }
  };
  if (parallel) {
    pool->ParallelFor(m, quantize, std::max<int64_t>(1, kMinQuantizePerThread / (k * n_formats)));
  } else {
    quantize(0, m, 0);
  }

  // Rows [begin, end) of the outputs laid end to end.
  auto gemm = [&](int64_t begin, int64_t end, int) {
    for (int o = 0; o < n_outs; ++o) {
      const int64_t lo = std::max(begin, first_row[o]), hi = std::min(end, first_row[o + 1]);
      if (lo >= hi) continue;
      const int f = format_of[o];
      const auto gemm_fn = format_rows16[f] ? isa->rows16_gemm : isa->gemm;
      gemm_fn(outs[o].w, act + format_offset[f], format_row_bytes[f], m, lo - first_row[o],
              hi - first_row[o], outs[o].y, outs[o].w.rows);
    }
  };
  if (parallel) {
    const int64_t rows_per_thread = (kMinWorkPerThread + m * k - 1) / (m * k);
    pool->ParallelFor(total_rows, gemm,
                      internal::RoundUp(std::max(kRowGrain, rows_per_thread), kRowGrain));
  } else {
    gemm(0, total_rows, 0);
  }
}

}  // namespace tandem::kernels
