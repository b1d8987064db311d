#include "common/dtype.h"

#include <cstdlib>

#include "common/check.h"

namespace tandem {

std::optional<DType> DTypeFromGguf(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 6: return DType::kQ5_0;
    case 8: return DType::kQ8_0;
    case 9: return DType::kQ8_1;
    case 12: return DType::kQ4_K;
    case 14: return DType::kQ6_K;
    case 15: return DType::kQ8_K;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

const DTypeInfo& GetDTypeInfo(DType t) {
  static const DTypeInfo kF32{"F32", 1, 4};
  static const DTypeInfo kF16{"F16", 1, 2};
  static const DTypeInfo kBF16{"BF16", 1, 2};
  static const DTypeInfo kQ4_0{"Q4_0", 32, 18};
  static const DTypeInfo kQ4_1{"Q4_1", 32, 20};
  static const DTypeInfo kQ5_0{"Q5_0", 32, 22};
  static const DTypeInfo kQ8_0{"Q8_0", 32, 34};
  static const DTypeInfo kQ8_1{"Q8_1", 32, 36};
  static const DTypeInfo kQ4_K{"Q4_K", 256, 144};
  static const DTypeInfo kQ6_K{"Q6_K", 256, 210};
  static const DTypeInfo kQ8_K{"Q8_K", 256, 292};
  switch (t) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ4_0: return kQ4_0;
    case DType::kQ4_1: return kQ4_1;
    case DType::kQ5_0: return kQ5_0;
    case DType::kQ8_0: return kQ8_0;
    case DType::kQ8_1: return kQ8_1;
    case DType::kQ4_K: return kQ4_K;
    case DType::kQ6_K: return kQ6_K;
    case DType::kQ8_K: return kQ8_K;
  }
  TANDEM_CHECK(false) << "not a DType value: " << static_cast<int>(t);
  return kF32;
}

}  // namespace tandem
