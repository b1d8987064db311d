#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/process_memory.h"
#include "model/gguf_writer.h"
#include "model/model_config.h"

namespace tandem::model {
namespace {

class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/tandem_gguf_XXXXXX";
    int fd = mkstemp(tmpl);
    close(fd);
    path_ = tmpl;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  void Write(const std::vector<uint8_t>& bytes) const {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);  // data() may be null
    std::fclose(f);
  }

 private:
  std::string path_;
};

GgufWriter SmallWriter() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 3);
  w.SetFloat32("llama.rope.freq_base", 500.5f);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.SetInt32Array("tokenizer.ggml.token_type", {1, 1, 3});
  std::vector<uint8_t> f32(4 * 8 * 2);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i);
  EXPECT_TRUE(w.AddTensor("x.weight", DType::kF32, {8, 2}, f32).ok());
  std::vector<uint8_t> q8(34 * 2, 7);
  EXPECT_TRUE(w.AddTensor("y.weight", DType::kQ8_0, {32, 2}, q8).ok());
  return w;
}

TEST(GgufTest, RoundTripsMetadataAndTensors) {
  TempFile tmp;
  tmp.Write(SmallWriter().Serialize());
  auto f = GgufFile::Open(tmp.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetUint("llama.block_count"), 3u);
  EXPECT_FLOAT_EQ(static_cast<float>(*(*f)->GetFloat("llama.rope.freq_base")), 500.5f);
  EXPECT_TRUE(*(*f)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ((*(*f)->GetStringArray("tokenizer.ggml.tokens"))[2], "<s>");
  EXPECT_EQ((*(*f)->GetIntArray("tokenizer.ggml.token_type"))[2], 3);
  const GgufTensor* x = (*f)->FindTensor("x.weight");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->num_bytes, 64);
  EXPECT_EQ(static_cast<const uint8_t*>(x->data)[63], 63);
  const GgufTensor* y = (*f)->FindTensor("y.weight");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->dtype, DType::kQ8_0);
  EXPECT_EQ(y->offset % 32, 0u);
  EXPECT_EQ(static_cast<const uint8_t*>(y->data)[0], 7);
  EXPECT_EQ((*f)->FindTensor("missing"), nullptr);
}

// Released pages leave the resident set and read back unchanged from the file.
TEST(GgufTest, ReleasedPagesLeaveMemoryAndReadBack) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  constexpr int64_t kBytes = 8 << 20;
  std::vector<uint8_t> big(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  ASSERT_TRUE(w.AddTensor("big.weight", DType::kF32, {kBytes / 4}, big).ok());
  TempFile tmp;
  tmp.Write(w.Serialize());
  auto f = GgufFile::Open(tmp.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufTensor* t = (*f)->FindTensor("big.weight");
  ASSERT_NE(t, nullptr);
  const auto* data = static_cast<const uint8_t*>(t->data);
  auto touch = [&] {
    uint64_t sum = 0;
    for (int64_t i = 0; i < kBytes; i += 512) sum += data[i];
    return sum;
  };
  const uint64_t sum = touch();
  const int64_t touched = ReadProcessMemory().resident_bytes;
  (*f)->ReleasePages(t->data, kBytes);
  const int64_t released = ReadProcessMemory().resident_bytes;
  if (touched > 0) {  // /proc readable
    EXPECT_GT(touched - released, kBytes / 2) << touched << " -> " << released;
  }
  EXPECT_EQ(touch(), sum);
  EXPECT_EQ(0, std::memcmp(data, big.data(), kBytes));
  (*f)->ReleasePages(big.data(), kBytes);  // outside the mapping: ignored
  EXPECT_EQ(big[12345], static_cast<uint8_t>(12345 * 131 + 7));
}

TEST(GgufTest, TypedGettersNameTheProblem) {
  TempFile tmp;
  tmp.Write(SmallWriter().Serialize());
  auto f = GgufFile::Open(tmp.path());
  ASSERT_TRUE(f.ok());
  auto missing = (*f)->GetUint("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  auto wrong = (*f)->GetUint("general.architecture");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
}

// Every truncation of a valid file is refused cleanly (no crash, no read past the mapping).
TEST(GgufTest, EveryTruncationIsRefused) {
  const std::vector<uint8_t> bytes = SmallWriter().Serialize();
  TempFile tmp;
  for (size_t n = 0; n < bytes.size(); ++n) {
    tmp.Write(std::vector<uint8_t>(bytes.begin(), bytes.begin() + n));
    auto f = GgufFile::Open(tmp.path());
    ASSERT_FALSE(f.ok()) << "accepted a file cut at " << n << " of " << bytes.size();
    EXPECT_FALSE(f.status().message().empty());
  }
}

// Random byte corruption never crashes: it is either refused or (if the change was benign)
// accepted with all tensors inside the file.
TEST(GgufTest, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> bytes = SmallWriter().Serialize();
  std::mt19937 rng(42);
  TempFile tmp;
  int refused = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    const int flips = 1 + iter % 4;
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
    tmp.Write(bad);
    auto f = GgufFile::Open(tmp.path());
    if (!f.ok()) {
      ++refused;
      continue;
    }
    for (const auto& t : (*f)->tensors()) {
      ASSERT_LE(t.offset + static_cast<uint64_t>(t.num_bytes), (*f)->file_size()) << t.name;
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(GgufTest, RefusesBadMagicVersionAndType) {
  std::vector<uint8_t> bytes = SmallWriter().Serialize();
  TempFile tmp;
  auto bad = bytes;
  bad[0] = 'X';
  tmp.Write(bad);
  auto f = GgufFile::Open(tmp.path());
  EXPECT_NE(f.status().message().find("bad magic"), std::string::npos) << f.status().ToString();

  bad = bytes;
  bad[4] = 9;
  tmp.Write(bad);
  f = GgufFile::Open(tmp.path());
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(f.status().message().find("version 9"), std::string::npos);

  f = GgufFile::Open("/nonexistent/model.gguf");
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  f = GgufFile::Open("/tmp");
  EXPECT_FALSE(f.ok());
}

TEST(GgufTest, RefusesUnsupportedTensorType) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  ASSERT_TRUE(w.AddTensor("t", DType::kF32, {4}, std::vector<uint8_t>(16)).ok());
  std::vector<uint8_t> bytes = w.Serialize();
  // The tensor type field sits 12 bytes before the end of the tensor table (type u32, offset u64).
  // Find it: the header is 24 bytes + kv + name; search for the name instead.
  const std::string name_field = std::string("\x01\0\0\0\0\0\0\0t", 9);
  auto it = std::search(bytes.begin(), bytes.end(), name_field.begin(), name_field.end());
  ASSERT_NE(it, bytes.end());
  const size_t type_at = (it - bytes.begin()) + 9 + 4 + 8;  // name, n_dims, dims[0]
  bytes[type_at] = 20;                                      // IQ4_NL
  TempFile tmp;
  tmp.Write(bytes);
  auto f = GgufFile::Open(tmp.path());
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(f.status().message().find("ggml type 20"), std::string::npos) << f.status().ToString();
}

std::string DefaultModelPath() {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(src ? src : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufTest, ReadsTheDefaultModel) {
  auto f = GgufFile::Open(DefaultModelPath());
  ASSERT_TRUE(f.ok()) << f.status().ToString() << " (run scripts/setup.sh to fetch the model)";
  auto cfg = ReadModelConfig(**f);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->n_layers, 30);
  EXPECT_EQ(cfg->dim, 576);
  EXPECT_EQ(cfg->ffn_dim, 1536);
  EXPECT_EQ(cfg->n_heads, 9);
  EXPECT_EQ(cfg->n_kv_heads, 3);
  EXPECT_EQ(cfg->head_dim, 64);
  EXPECT_EQ(cfg->vocab_size, 49152);
  EXPECT_TRUE(cfg->tied_output);
  EXPECT_FLOAT_EQ(cfg->rope_freq_base, 100000.0f);
  auto vocab = ReadVocab(**f);
  ASSERT_TRUE(vocab.ok()) << vocab.status().ToString();
  EXPECT_EQ(vocab->model, "gpt2");
  EXPECT_EQ(vocab->pre, "smollm");
  EXPECT_EQ(vocab->tokens.size(), 49152u);
  EXPECT_EQ(vocab->merges.size(), 48900u);
  EXPECT_EQ(vocab->tokens[2], "<|im_end|>");
  EXPECT_EQ(vocab->eos_id, 2);
  EXPECT_FALSE(vocab->add_bos);
}

}  // namespace
}  // namespace tandem::model
