// Read-only view of a GGUF v2/v3 file through mmap.
//
//   TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open("model.gguf"));
//   TANDEM_ASSIGN_OR_RETURN(uint32_t layers, f->GetUint("llama.block_count"));
//   const GgufTensor* t = f->FindTensor("token_embd.weight");
//
// Every length, count, offset and dimension in the file is checked against the mapping before
// use: a truncated, corrupt or unsupported file gives a Status naming what is wrong, never a
// read past the end. Tensor data stays in the mapping (zero copy); the GgufFile owns the mapping
// and must outlive every pointer it hands out. Thread-safety: immutable after Open.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tandem::model {

// Metadata value types as numbered in the GGUF format.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufValueType elem_type;
  std::vector<GgufValue> items;
};
// Integers widen to (u)int64, floats to double; the original type is kept in `type`.
struct GgufValue {
  GgufValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
};

struct GgufTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the innermost (contiguous) dimension
  int64_t num_elements;
  int64_t num_bytes;
  uint64_t offset;   // from the start of the data section
  const void* data;  // inside the mapping
};

class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(const std::string& name) const;
  // Drops the mapping's whole pages inside [data, data + bytes) from this process's resident
  // memory (a copy replaced them); they are read back from the file if touched again.
  void ReleasePages(const void* data, size_t bytes) const;

  // Typed metadata access: NotFound if absent, InvalidArgument if of another kind.
  bool Has(const std::string& key) const { return metadata_.count(key) != 0; }
  StatusOr<std::string> GetString(const std::string& key) const;
  StatusOr<uint64_t> GetUint(const std::string& key) const;  // any non-negative integer
  StatusOr<int64_t> GetInt(const std::string& key) const;    // any integer
  StatusOr<double> GetFloat(const std::string& key) const;   // any float or integer
  StatusOr<bool> GetBool(const std::string& key) const;
  StatusOr<std::vector<std::string>> GetStringArray(const std::string& key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  StatusOr<std::vector<double>> GetFloatArray(const std::string& key) const;  // floats or ints

 private:
  GgufFile() = default;
  Status Parse();

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace tandem::model
