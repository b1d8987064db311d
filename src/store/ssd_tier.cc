#include "store/ssd_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "store/checksum_internal.h"

namespace tandem::store {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'K', 'V', '0', '1'};
constexpr uint64_t kHeaderBytes = 32;  // magic, key length, 0, size, checksum
constexpr uint32_t kMaxKeyBytes = 4096;

struct Header {
  uint32_t key_bytes = 0;
  uint64_t size = 0, checksum = 0;
};

void EncodeHeader(const Header& h, uint8_t out[kHeaderBytes]) {
  std::memcpy(out, kMagic, 8);
  const uint32_t zero = 0;
  std::memcpy(out + 8, &h.key_bytes, 4);
  std::memcpy(out + 12, &zero, 4);
  std::memcpy(out + 16, &h.size, 8);
  std::memcpy(out + 24, &h.checksum, 8);
}

bool DecodeHeader(const uint8_t in[kHeaderBytes], Header* h) {
  if (std::memcmp(in, kMagic, 8) != 0) return false;
  std::memcpy(&h->key_bytes, in + 8, 4);
  std::memcpy(&h->size, in + 16, 8);
  std::memcpy(&h->checksum, in + 24, 8);
  return h->key_bytes > 0 && h->key_bytes <= kMaxKeyBytes;
}

std::string FileName(const std::string& key) {
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx.kv",
                static_cast<unsigned long long>(internal::ObjectChecksum(key.data(), key.size())));
  return name;
}

// A file descriptor closed on scope exit.
struct Fd {
  explicit Fd(int fd) : fd(fd) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int fd;
};

bool WriteAll(int fd, const void* data, uint64_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, uint64_t n, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

class SsdTierImpl final : public SsdTier {
 public:
  explicit SsdTierImpl(SsdTierOptions o) : options_(std::move(o)) {
    stats_.capacity_bytes = options_.capacity_bytes;
  }

  ~SsdTierImpl() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    if (writer_.joinable()) writer_.join();
  }

  Status Init() {
    std::error_code ec;
    fs::create_directories(options_.dir, ec);
    if (ec) return Unavailable("SSD tier " + options_.dir + ": " + ec.message());
    const std::string probe = options_.dir + "/.probe";
    {
      Fd fd(::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600));
      if (fd.fd < 0 || !WriteAll(fd.fd, kMagic, sizeof(kMagic), 0)) {
        return Unavailable("SSD tier " + options_.dir +
                           " is not writable: " + std::strerror(errno));
      }
    }
    ::unlink(probe.c_str());
    Index();
    writer_ = std::thread([this] { WriterLoop(); });
    return OkStatus();
  }

  bool Offer(const std::string& key, const void* bytes, uint64_t size) override {
    if (key.empty() || key.size() > kMaxKeyBytes || size == 0) return false;
    MutexLock lock(&mu_);
    if (index_.count(key) > 0 || queued_keys_.count(key) > 0) return true;
    if (queued_bytes_ + size > options_.queue_bytes ||
        kHeaderBytes + key.size() + size > options_.capacity_bytes) {
      ++stats_.dropped;
      return false;
    }
    Pending p{key, std::vector<uint8_t>(static_cast<const uint8_t*>(bytes),
                                        static_cast<const uint8_t*>(bytes) + size)};
    queued_bytes_ += size;
    queued_keys_.insert(key);
    queue_.push_back(std::move(p));
    cv_.NotifyAll();
    return true;
  }

  bool Holds(const std::string& key) const override {
    MutexLock lock(&mu_);
    return index_.count(key) > 0;
  }

  bool Read(const std::string& key, void* dest, uint64_t size) override {
    {
      MutexLock lock(&mu_);
      auto it = index_.find(key);
      if (it == index_.end() || it->second.size != size) {
        ++stats_.misses;
        return false;
      }
      lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    }
    const std::string path = options_.dir + "/" + FileName(key);
    bool intact = false;
    {
      Fd fd(::open(path.c_str(), O_RDONLY));
      uint8_t raw[kHeaderBytes];
      Header h;
      std::string stored_key(key.size(), '\0');
      intact = fd.fd >= 0 && ReadAll(fd.fd, raw, kHeaderBytes, 0) && DecodeHeader(raw, &h) &&
               h.key_bytes == key.size() && h.size == size &&
               ReadAll(fd.fd, stored_key.data(), key.size(), kHeaderBytes) && stored_key == key &&
               ReadAll(fd.fd, dest, size, kHeaderBytes + key.size()) &&
               internal::ObjectChecksum(dest, size) == h.checksum;
    }
    MutexLock lock(&mu_);
    if (intact) {
      ++stats_.hits;
      return true;
    }
    ++stats_.corrupt;
    ++stats_.misses;
    auto it = index_.find(key);
    if (it != index_.end()) Forget(it);
    ::unlink(path.c_str());
    return false;
  }

  void Flush() override {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [this] {
      mu_.AssertHeld();
      return (queue_.empty() && !writing_) || stop_;
    });
  }

  SsdTierStats Stats() const override {
    MutexLock lock(&mu_);
    SsdTierStats s = stats_;
    s.used_bytes = used_;
    s.objects = index_.size();
    return s;
  }

 private:
  struct Pending {
    std::string key;
    std::vector<uint8_t> bytes;
  };
  struct Entry {
    uint64_t size = 0;        // object bytes
    uint64_t file_bytes = 0;  // on disk, header included
    std::list<std::string>::iterator lru_pos;
  };

  // Indexes the files a previous process left.
  void Index() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(options_.dir, ec)) {
      const std::string path = e.path().string();
      if (e.path().extension() == ".tmp") {  // a write that never finished
        ::unlink(path.c_str());
        continue;
      }
      if (e.path().extension() != ".kv") continue;
      Fd fd(::open(path.c_str(), O_RDONLY));
      uint8_t raw[kHeaderBytes];
      Header h;
      std::string key;
      bool ok = fd.fd >= 0 && ReadAll(fd.fd, raw, kHeaderBytes, 0) && DecodeHeader(raw, &h);
      if (ok) {
        key.resize(h.key_bytes);
        ok = ReadAll(fd.fd, key.data(), h.key_bytes, kHeaderBytes) &&
             e.path().filename().string() == FileName(key) &&
             e.file_size(ec) == kHeaderBytes + h.key_bytes + h.size;
      }
      if (!ok) {
        ::unlink(path.c_str());
        continue;
      }
      MutexLock lock(&mu_);
      Add(key, h.size, kHeaderBytes + h.key_bytes + h.size);
    }
    MutexLock lock(&mu_);
    EvictDownTo(options_.capacity_bytes);
    if (!index_.empty()) {
      GetLogger("pool")->info("SSD tier {}: {} objects ({} bytes) from an earlier run",
                              options_.dir, index_.size(), used_);
    }
  }

  void Add(const std::string& key, uint64_t size, uint64_t file_bytes) TANDEM_REQUIRES(mu_) {
    lru_.push_front(key);
    index_[key] = Entry{size, file_bytes, lru_.begin()};
    used_ += file_bytes;
  }

  void Forget(std::unordered_map<std::string, Entry>::iterator it) TANDEM_REQUIRES(mu_) {
    used_ -= it->second.file_bytes;
    lru_.erase(it->second.lru_pos);
    index_.erase(it);
  }

  // Deletes least recently used files until at most `limit` bytes are used.
  void EvictDownTo(uint64_t limit) TANDEM_REQUIRES(mu_) {
    while (used_ > limit && !lru_.empty()) {
      const std::string key = lru_.back();
      ::unlink((options_.dir + "/" + FileName(key)).c_str());
      Forget(index_.find(key));
      ++stats_.evictions;
    }
  }

  void WriterLoop() {
    for (;;) {
      Pending p;
      {
        MutexLock lock(&mu_);
        cv_.Wait(&mu_, [this] {
          mu_.AssertHeld();
          return stop_ || !queue_.empty();
        });
        if (stop_) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        // Room first, so the disk never holds more than the capacity.
        const uint64_t file_bytes = kHeaderBytes + p.key.size() + p.bytes.size();
        EvictDownTo(options_.capacity_bytes - std::min(options_.capacity_bytes, file_bytes));
      }
      const bool ok = WriteFile(p);
      MutexLock lock(&mu_);
      queued_bytes_ -= p.bytes.size();
      queued_keys_.erase(p.key);
      if (ok) {
        auto old = index_.find(p.key);
        if (old != index_.end()) Forget(old);
        Add(p.key, p.bytes.size(), kHeaderBytes + p.key.size() + p.bytes.size());
        ++stats_.written;
      } else {
        ++stats_.write_failures;
        ++stats_.dropped;
      }
      writing_ = false;
      cv_.NotifyAll();
    }
  }

  // Writes one file: to a temporary name, then renamed into place.
  bool WriteFile(const Pending& p) {
    const std::string path = options_.dir + "/" + FileName(p.key);
    const std::string tmp = path + ".tmp";
    Header h;
    h.key_bytes = static_cast<uint32_t>(p.key.size());
    h.size = p.bytes.size();
    h.checksum = internal::ObjectChecksum(p.bytes.data(), p.bytes.size());
    uint8_t raw[kHeaderBytes];
    EncodeHeader(h, raw);
    bool ok = false;
    {
      Fd fd(::open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600));
      ok = fd.fd >= 0 && WriteAll(fd.fd, raw, kHeaderBytes, 0) &&
           WriteAll(fd.fd, p.key.data(), p.key.size(), kHeaderBytes) &&
           WriteAll(fd.fd, p.bytes.data(), p.bytes.size(), kHeaderBytes + p.key.size());
    }
    ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
      const int err = errno;
      ::unlink(tmp.c_str());
      if (!warned_) {
        GetLogger("pool")->warn("SSD tier {}: writing a block failed: {}", options_.dir,
                                std::strerror(err));
        warned_ = true;
      }
    }
    return ok;
  }

  const SsdTierOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  bool writing_ TANDEM_GUARDED_BY(mu_) = false;
  std::deque<Pending> queue_ TANDEM_GUARDED_BY(mu_);
  std::unordered_set<std::string> queued_keys_ TANDEM_GUARDED_BY(mu_);
  uint64_t queued_bytes_ TANDEM_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, Entry> index_ TANDEM_GUARDED_BY(mu_);
  std::list<std::string> lru_ TANDEM_GUARDED_BY(mu_);  // most recently used first
  uint64_t used_ TANDEM_GUARDED_BY(mu_) = 0;
  SsdTierStats stats_ TANDEM_GUARDED_BY(mu_);
  bool warned_ = false;  // writer thread only
  std::thread writer_;   // WriterLoop; last member
};

}  // namespace

StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(SsdTierOptions options) {
  if (options.dir.empty()) return InvalidArgument("SSD tier: no directory given");
  if (options.capacity_bytes == 0) return InvalidArgument("SSD tier: capacity must be positive");
  auto tier = std::make_unique<SsdTierImpl>(std::move(options));
  TANDEM_RETURN_IF_ERROR(tier->Init());
  return std::unique_ptr<SsdTier>(std::move(tier));
}

}  // namespace tandem::store
