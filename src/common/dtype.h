// Tensor element types as numbered by the GGUF format (ggml_type), with their block layout.
// Only the types tandem computes with are listed; others are refused at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace tandem {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ4_K = 12,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

struct DTypeInfo {
  const char* name;     // "Q4_1"
  int64_t block_elems;  // elements per block (1 for plain floats)
  int64_t block_bytes;  // bytes per block
};

// Returns nullopt for a ggml type number tandem does not support.
std::optional<DType> DTypeFromGguf(uint32_t ggml_type);
const DTypeInfo& GetDTypeInfo(DType t);
// Bytes of a row of n elements; n must be a multiple of block_elems.
inline int64_t RowBytes(DType t, int64_t n) {
  const DTypeInfo& info = GetDTypeInfo(t);
  return n / info.block_elems * info.block_bytes;
}

}  // namespace tandem
