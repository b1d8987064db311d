// The KV pool's SSD tier reading a file it did not write (a disk is input too): the fuzz input
// is placed in the tier's directory as the file of key "ns/k" (and, from its byte 0, as a
// stray temporary), then a tier opens the directory (indexing it) and reads the key at the size
// the file's header claims and at a fixed one.
// Properties: no crash or sanitizer report; a read that succeeds returns exactly the object
// bytes of the file (header, key, then the object); the tier's accounting stays within its
// capacity.
#include <unistd.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "store/ssd_tier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const fs::path dir =
      fs::temp_directory_path() / ("tandem-fuzz-ssd-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string key = "ns/k";
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx.kv",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (size > 0 && data[0] % 2 == 1) std::ofstream(dir / "0000000000000000.kv.tmp") << "torn";
  constexpr uint64_t kCapacity = 1 << 20;
  auto tier = tandem::store::SsdTier::Open({dir.string(), kCapacity});
  TANDEM_FUZZ_CHECK(tier.ok());
  uint64_t claimed = 0;
  if (size >= 24) std::memcpy(&claimed, data + 16, 8);
  for (uint64_t want : {claimed, uint64_t{64}}) {
    if (want == 0 || want > kCapacity) continue;
    std::vector<uint8_t> dest(want);
    if ((*tier)->Read(key, dest.data(), want)) {
      const size_t at = 32 + key.size();
      TANDEM_FUZZ_CHECK(size == at + want);
      TANDEM_FUZZ_CHECK(std::memcmp(dest.data(), data + at, want) == 0);
    }
  }
  const auto stats = (*tier)->Stats();
  TANDEM_FUZZ_CHECK(stats.used_bytes <= kCapacity);
  TANDEM_FUZZ_CHECK(!fs::exists(dir / "0000000000000000.kv.tmp"));
  tier->reset();
  fs::remove_all(dir);
  return 0;
}
