#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace tandem::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 2;

// Bounds-checked little-endian cursor over the mapping.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) return Truncated(what);
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }
  Status ReadString(std::string* out, const char* what) {
    uint64_t len = 0;
    TANDEM_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return DataLoss(std::string(what) + ": string length " + std::to_string(len) +
                      " exceeds the " + std::to_string(remaining()) + " bytes left in the file");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return OkStatus();
  }
  Status Truncated(const char* what) const {
    return DataLoss(std::string("file truncated while reading ") + what + " at byte " +
                    std::to_string(pos_));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

size_t MinEncodedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kString:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

template <typename T, typename Wide>
Status ReadScalar(Reader& r, GgufValue* v, const char* what) {
  T x{};
  TANDEM_RETURN_IF_ERROR(r.Read(&x, what));
  v->value = static_cast<Wide>(x);
  return OkStatus();
}

Status ReadValue(Reader& r, GgufValueType type, GgufValue* v, int depth, const std::string& key) {
  v->type = type;
  const char* what = "metadata value";
  switch (type) {
    case GgufValueType::kUint8: return ReadScalar<uint8_t, uint64_t>(r, v, what);
    case GgufValueType::kInt8: return ReadScalar<int8_t, int64_t>(r, v, what);
    case GgufValueType::kUint16: return ReadScalar<uint16_t, uint64_t>(r, v, what);
    case GgufValueType::kInt16: return ReadScalar<int16_t, int64_t>(r, v, what);
    case GgufValueType::kUint32: return ReadScalar<uint32_t, uint64_t>(r, v, what);
    case GgufValueType::kInt32: return ReadScalar<int32_t, int64_t>(r, v, what);
    case GgufValueType::kUint64: return ReadScalar<uint64_t, uint64_t>(r, v, what);
    case GgufValueType::kInt64: return ReadScalar<int64_t, int64_t>(r, v, what);
    case GgufValueType::kFloat32: return ReadScalar<float, double>(r, v, what);
    case GgufValueType::kFloat64: return ReadScalar<double, double>(r, v, what);
    case GgufValueType::kBool: {
      uint8_t b = 0;
      TANDEM_RETURN_IF_ERROR(r.Read(&b, what));
      if (b > 1) return DataLoss("metadata '" + key + "': bool byte is " + std::to_string(b));
      v->value = b != 0;
      return OkStatus();
    }
    case GgufValueType::kString: {
      std::string s;
      TANDEM_RETURN_IF_ERROR(r.ReadString(&s, "metadata string"));
      v->value = std::move(s);
      return OkStatus();
    }
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth)
        return DataLoss("metadata '" + key + "': arrays nested too deep");
      uint32_t elem_raw = 0;
      uint64_t count = 0;
      TANDEM_RETURN_IF_ERROR(r.Read(&elem_raw, "array element type"));
      TANDEM_RETURN_IF_ERROR(r.Read(&count, "array length"));
      if (elem_raw > static_cast<uint32_t>(GgufValueType::kFloat64)) {
        return DataLoss("metadata '" + key + "': unknown array element type " +
                        std::to_string(elem_raw));
      }
      const auto elem = static_cast<GgufValueType>(elem_raw);
      if (count > r.remaining() / MinEncodedSize(elem)) {
        return DataLoss("metadata '" + key + "': array of " + std::to_string(count) +
                        " elements cannot fit in the " + std::to_string(r.remaining()) +
                        " bytes left");
      }
      GgufArray arr{elem, {}};
      arr.items.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        TANDEM_RETURN_IF_ERROR(ReadValue(r, elem, &arr.items[i], depth + 1, key));
      }
      v->value = std::move(arr);
      return OkStatus();
    }
  }
  return DataLoss("metadata '" + key + "': unknown value type " +
                  std::to_string(static_cast<uint32_t>(type)));
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) return NotFound("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (fstat(f->fd_, &st) != 0) return Internal("fstat '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("'" + path + "' is not a regular file");
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 24) {
    return DataLoss("'" + path + "' is " + std::to_string(f->size_) +
                    " bytes, too small for a GGUF header");
  }
  void* p = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, f->fd_, 0);
  if (p == MAP_FAILED) return Internal("mmap '" + path + "': " + std::strerror(errno));
  f->base_ = static_cast<const uint8_t*>(p);
  Status st2 = f->Parse();
  if (!st2.ok()) return st2.WithContext("GGUF '" + path + "'");
  return f;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

Status GgufFile::Parse() {
  Reader r(base_, size_);
  uint32_t magic = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (magic != kMagic) return InvalidArgument("not a GGUF file (bad magic)");
  TANDEM_RETURN_IF_ERROR(r.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return Unimplemented("GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  TANDEM_RETURN_IF_ERROR(r.Read(&n_tensors, "tensor count"));
  TANDEM_RETURN_IF_ERROR(r.Read(&n_kv, "metadata count"));
  // Each entry takes at least 12 bytes; reject counts the file cannot hold before allocating.
  if (n_kv > r.remaining() / 12 || n_tensors > r.remaining() / 24) {
    return DataLoss("header claims " + std::to_string(n_kv) + " metadata entries and " +
                    std::to_string(n_tensors) + " tensors, more than the file can hold");
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    uint32_t type = 0;
    TANDEM_RETURN_IF_ERROR(r.ReadString(&key, "metadata key"));
    TANDEM_RETURN_IF_ERROR(r.Read(&type, "metadata type"));
    GgufValue v;
    TANDEM_RETURN_IF_ERROR(ReadValue(r, static_cast<GgufValueType>(type), &v, 0, key));
    if (!metadata_.emplace(key, std::move(v)).second) {
      return DataLoss("duplicate metadata key '" + key + "'");
    }
  }
  if (Has("general.alignment")) {
    TANDEM_ASSIGN_OR_RETURN(alignment_, GetUint("general.alignment"));
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > 65536) {
      return DataLoss("general.alignment " + std::to_string(alignment_) + " is not a power of two");
    }
  }
  tensors_.resize(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor& t = tensors_[i];
    TANDEM_RETURN_IF_ERROR(r.ReadString(&t.name, "tensor name"));
    uint32_t n_dims = 0;
    TANDEM_RETURN_IF_ERROR(r.Read(&n_dims, "tensor dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return DataLoss("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions");
    }
    t.num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      TANDEM_RETURN_IF_ERROR(r.Read(&dim, "tensor dimension"));
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(t.num_elements) > (uint64_t{1} << 50) / dim) {
        return DataLoss("tensor '" + t.name + "' has an invalid dimension " + std::to_string(dim));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
      t.num_elements *= static_cast<int64_t>(dim);
    }
    uint32_t type = 0;
    TANDEM_RETURN_IF_ERROR(r.Read(&type, "tensor type"));
    auto dtype = DTypeFromGguf(type);
    if (!dtype) {
      return Unimplemented("tensor '" + t.name + "' has ggml type " + std::to_string(type) +
                           ", which tandem does not support (F32, F16, BF16, Q4_0, Q4_1, Q8_0, "
                           "Q4_K, Q6_K are)");
    }
    t.dtype = *dtype;
    const auto& info = GetDTypeInfo(t.dtype);
    if (t.dims[0] % info.block_elems != 0) {
      return DataLoss("tensor '" + t.name + "': row of " + std::to_string(t.dims[0]) +
                      " elements is not a multiple of the " + info.name + " block size");
    }
    t.num_bytes = t.num_elements / info.block_elems * info.block_bytes;
    TANDEM_RETURN_IF_ERROR(r.Read(&t.offset, "tensor offset"));
    if (t.offset % alignment_ != 0) {
      return DataLoss("tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                      " is not aligned to " + std::to_string(alignment_));
    }
    if (!tensor_index_.emplace(t.name, i).second) {
      return DataLoss("duplicate tensor name '" + t.name + "'");
    }
  }
  const uint64_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_) return DataLoss("file truncated before the tensor data section");
  for (GgufTensor& t : tensors_) {
    if (t.offset > size_ - data_start ||
        static_cast<uint64_t>(t.num_bytes) > size_ - data_start - t.offset) {
      return DataLoss("tensor '" + t.name + "' (" + std::to_string(t.num_bytes) +
                      " bytes at data offset " + std::to_string(t.offset) +
                      ") extends past the end of the file (" + std::to_string(size_) + " bytes)");
    }
    t.data = base_ + data_start + t.offset;
  }
  return OkStatus();
}

void GgufFile::ReleasePages(const void* data, size_t bytes) const {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  const auto base = reinterpret_cast<uintptr_t>(base_);
  if (first >= last || first < base || last > base + size_) return;
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advice: may fail
}

const GgufTensor* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
StatusOr<const GgufValue*> Lookup(const std::map<std::string, GgufValue>& m,
                                  const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return NotFound("metadata key '" + key + "' is missing");
  return &it->second;
}
Status WrongType(const std::string& key, const char* want) {
  return InvalidArgument("metadata key '" + key + "' is not " + want);
}
}  // namespace

StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  if (auto* s = std::get_if<std::string>(&v->value)) return *s;
  return WrongType(key, "a string");
}

StatusOr<uint64_t> GgufFile::GetUint(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  if (auto* u = std::get_if<uint64_t>(&v->value)) return *u;
  if (auto* i = std::get_if<int64_t>(&v->value); i && *i >= 0) return static_cast<uint64_t>(*i);
  return WrongType(key, "a non-negative integer");
}

StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  if (auto* i = std::get_if<int64_t>(&v->value)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v->value); u && *u <= INT64_MAX)
    return static_cast<int64_t>(*u);
  return WrongType(key, "an integer");
}

StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  if (auto* d = std::get_if<double>(&v->value)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&v->value)) return static_cast<double>(*i);
  return WrongType(key, "a number");
}

StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  if (auto* b = std::get_if<bool>(&v->value)) return *b;
  return WrongType(key, "a bool");
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  auto* arr = std::get_if<GgufArray>(&v->value);
  if (arr == nullptr || arr->elem_type != GgufValueType::kString) {
    return WrongType(key, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(arr->items.size());
  for (const auto& item : arr->items) out.push_back(std::get<std::string>(item.value));
  return out;
}

StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  auto* arr = std::get_if<GgufArray>(&v->value);
  if (arr == nullptr) return WrongType(key, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(arr->items.size());
  for (const auto& item : arr->items) {
    if (auto* i = std::get_if<int64_t>(&item.value)) {
      out.push_back(*i);
    } else if (auto* u = std::get_if<uint64_t>(&item.value)) {
      out.push_back(static_cast<int64_t>(*u));
    } else {
      return WrongType(key, "an array of integers");
    }
  }
  return out;
}

StatusOr<std::vector<double>> GgufFile::GetFloatArray(const std::string& key) const {
  TANDEM_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(metadata_, key));
  auto* arr = std::get_if<GgufArray>(&v->value);
  if (arr == nullptr) return WrongType(key, "an array of numbers");
  std::vector<double> out;
  out.reserve(arr->items.size());
  for (const auto& item : arr->items) {
    if (auto* d = std::get_if<double>(&item.value)) {
      out.push_back(*d);
    } else if (auto* i = std::get_if<int64_t>(&item.value)) {
      out.push_back(static_cast<double>(*i));
    } else if (auto* u = std::get_if<uint64_t>(&item.value)) {
      out.push_back(static_cast<double>(*u));
    } else {
      return WrongType(key, "an array of numbers");
    }
  }
  return out;
}

}  // namespace tandem::model
