// The GGUF reader (model/gguf.h) on arbitrary files, and what reads a model's text side from
// one: the model config, the vocabulary, the tokenizer built from it, the chat template.
// Input: the file's bytes (written to a memfd that GgufFile::Open maps).
// Properties: no crash or sanitizer report; every tensor that Open accepts lies inside the
// file (its first and last byte are read: outside the mapping that is a SIGSEGV/SIGBUS); a
// tokenizer that builds encodes and decodes text without crashing, with ids in its vocabulary.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/text_front_end.h"
#include "model/tokenizer.h"

namespace {

using namespace tandem;

int MemFd() {
  static const int fd = ::memfd_create("fuzz.gguf", MFD_CLOEXEC);
  return fd;
}

void TryTokenizer(const model::VocabData& vocab) {
  auto tok = model::Tokenizer::Create(vocab);
  if (!tok.ok()) return;
  for (const char* text :
       {"Hello, world!  <|im_start|>\xe4\xbd\xa0\xe5\xa5\xbd \xff\x80 12345", "", " ", "\n\n\t"}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*tok)->Encode(text, (*tok)->add_bos(), special);
      for (int32_t id : ids) TANDEM_FUZZ_CHECK(id >= 0 && id < (*tok)->vocab_size());
      (void)(*tok)->Decode(ids);
    }
  }
  (void)(*tok)->EndOfGenerationIds();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = MemFd();
  TANDEM_FUZZ_CHECK(fd >= 0);
  TANDEM_FUZZ_CHECK(::ftruncate(fd, 0) == 0);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    TANDEM_FUZZ_CHECK(n > 0);
    done += static_cast<size_t>(n);
  }
  auto file = model::GgufFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (!file.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const model::GgufTensor& t : (*file)->tensors()) {
    TANDEM_FUZZ_CHECK(t.num_bytes >= 0);
    if (t.num_bytes == 0) continue;
    const auto* p = static_cast<const uint8_t*>(t.data);
    sink = sink ^ p[0] ^ p[t.num_bytes - 1];
  }
  for (const auto& [key, value] : (*file)->metadata()) {
    (void)(*file)->GetString(key);
    (void)(*file)->GetIntArray(key);
    (void)(*file)->GetFloatArray(key);
  }
  auto vocab = model::ReadVocab(**file);
  if (vocab.ok()) TryTokenizer(*vocab);
  auto config = model::ReadModelConfig(**file);
  if (config.ok()) {
    auto front = model::LoadTextFrontEnd(**file, *config);
    if (front.ok() && front->chat_template) {
      (void)front->chat_template->Apply({{"user", "hi"}}, /*add_generation_prompt=*/true).ok();
    }
  }
  return 0;
}
