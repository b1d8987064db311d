// Builds GGUF v3 files in memory and writes them out: used by tests to make tiny random-weight
// models, and by tools that convert or trim models.
//
//   GgufWriter w;
//   w.SetString("general.architecture", "llama");
//   w.SetUint32("llama.block_count", 2);
//   w.AddTensor("token_embd.weight", DType::kQ8_0, {64, 256}, bytes);
//   TANDEM_RETURN_IF_ERROR(w.WriteFile(path));
//
// Not thread-safe. Tensor bytes are copied in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tandem::model {

class GgufWriter {
 public:
  void SetString(const std::string& key, const std::string& value);
  void SetUint32(const std::string& key, uint32_t value);
  void SetInt32(const std::string& key, int32_t value);
  void SetFloat32(const std::string& key, float value);
  void SetBool(const std::string& key, bool value);
  void SetStringArray(const std::string& key, const std::vector<std::string>& values);
  void SetInt32Array(const std::string& key, const std::vector<int32_t>& values);
  void SetFloat32Array(const std::string& key, const std::vector<float>& values);

  // dims in GGUF order (dims[0] innermost). bytes.size() must equal the tensor's byte size.
  Status AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                   std::vector<uint8_t> bytes);

  // The whole file (alignment 32).
  std::vector<uint8_t> Serialize() const;
  Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;
  };
  // Metadata as already-encoded "key, type, value" records, in insertion order.
  std::vector<std::vector<uint8_t>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace tandem::model
