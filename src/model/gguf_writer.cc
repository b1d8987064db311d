#include "model/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "model/gguf.h"

namespace tandem::model {
namespace {

constexpr uint64_t kAlignment = 32;

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

std::vector<uint8_t> Header(const std::string& key, GgufValueType type) {
  std::vector<uint8_t> rec;
  PutString(rec, key);
  Put<uint32_t>(rec, static_cast<uint32_t>(type));
  return rec;
}

}  // namespace

void GgufWriter::SetString(const std::string& key, const std::string& value) {
  auto rec = Header(key, GgufValueType::kString);
  PutString(rec, value);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetUint32(const std::string& key, uint32_t value) {
  auto rec = Header(key, GgufValueType::kUint32);
  Put(rec, value);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetInt32(const std::string& key, int32_t value) {
  auto rec = Header(key, GgufValueType::kInt32);
  Put(rec, value);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetFloat32(const std::string& key, float value) {
  auto rec = Header(key, GgufValueType::kFloat32);
  Put(rec, value);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetBool(const std::string& key, bool value) {
  auto rec = Header(key, GgufValueType::kBool);
  Put<uint8_t>(rec, value ? 1 : 0);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& values) {
  auto rec = Header(key, GgufValueType::kArray);
  Put<uint32_t>(rec, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(rec, values.size());
  for (const auto& v : values) PutString(rec, v);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  auto rec = Header(key, GgufValueType::kArray);
  Put<uint32_t>(rec, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<uint64_t>(rec, values.size());
  for (int32_t v : values) Put(rec, v);
  kv_.push_back(std::move(rec));
}

void GgufWriter::SetFloat32Array(const std::string& key, const std::vector<float>& values) {
  auto rec = Header(key, GgufValueType::kArray);
  Put<uint32_t>(rec, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<uint64_t>(rec, values.size());
  for (float v : values) Put(rec, v);
  kv_.push_back(std::move(rec));
}

Status GgufWriter::AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                             std::vector<uint8_t> bytes) {
  if (dims.empty() || dims.size() > 4) return InvalidArgument("tensor '" + name + "': bad rank");
  int64_t elems = 1;
  for (int64_t d : dims) elems *= d;
  const auto& info = GetDTypeInfo(dtype);
  if (dims[0] % info.block_elems != 0) {
    return InvalidArgument("tensor '" + name + "': row not a multiple of the block size");
  }
  const int64_t want = elems / info.block_elems * info.block_bytes;
  if (static_cast<int64_t>(bytes.size()) != want) {
    return InvalidArgument("tensor '" + name + "': " + std::to_string(bytes.size()) +
                           " bytes given, " + std::to_string(want) + " expected");
  }
  tensors_.push_back({name, dtype, dims, std::move(bytes)});
  return OkStatus();
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  Put<uint32_t>(out, 0x46554747);
  Put<uint32_t>(out, 3);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, kv_.size());
  for (const auto& rec : kv_) out.insert(out.end(), rec.begin(), rec.end());
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(out, static_cast<uint64_t>(d));
    Put<uint32_t>(out, static_cast<uint32_t>(t.dtype));
    Put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset = (offset + t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  // No padding after the last tensor: the file ends with its data.
  if (!tensors_.empty()) offset = offsets.back() + tensors_.back().bytes.size();
  out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
  const size_t data_start = out.size();
  out.resize(data_start + offset, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::memcpy(out.data() + data_start + offsets[i], tensors_[i].bytes.data(),
                tensors_[i].bytes.size());
  }
  return out;
}

Status GgufWriter::WriteFile(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return Internal("cannot create '" + path + "'");
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    return Internal("short write to '" + path + "'");
  }
  return OkStatus();
}

}  // namespace tandem::model
