// MatMul entry point: instruction-set dispatch, activation conversion, threading.
#include "kernels/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
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
  if (m <= 0 || w.rows <= 0) return;
  const int64_t k = w.cols;
  TANDEM_CHECK(IsWeightType(w.dtype) && k > 0 && k % GetDTypeInfo(w.dtype).block_elems == 0)
      << "MatMul: unsupported weight " << GetDTypeInfo(w.dtype).name << " with " << k << " columns";
  const IsaImpl* isa = CurrentIsa();
  const int64_t act_row_bytes = isa->act_row_bytes(w.dtype, k);
  uint8_t* act = internal::ThreadScratch(0, static_cast<size_t>(m * act_row_bytes));
  const bool parallel = pool != nullptr && pool->num_threads() > 1;

  auto quantize = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      isa->quantize_act(w.dtype, x + i * k, k, act + i * act_row_bytes);
    }
  };
  if (parallel) {
    pool->ParallelFor(m, quantize, std::max<int64_t>(1, kMinQuantizePerThread / k));
  } else {
    quantize(0, m, 0);
  }

  auto gemm = [&](int64_t begin, int64_t end, int) {
    isa->gemm(w, act, act_row_bytes, m, begin, end, y, w.rows);
  };
  if (parallel) {
    const int64_t rows_per_thread = (kMinWorkPerThread + m * k - 1) / (m * k);
    pool->ParallelFor(w.rows, gemm,
                      internal::RoundUp(std::max(kRowGrain, rows_per_thread), kRowGrain));
  } else {
    gemm(0, w.rows, 0);
  }
}

}  // namespace tandem::kernels
