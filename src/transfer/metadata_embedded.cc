// The "embedded:<name>" store: an in-process map shared by every store opened with the same
// name. Each key remembers which store wrote it last; destroying that store removes the key
// (the in-process analogue of a lease being revoked).
#include <cstdint>
#include <map>
#include <unordered_map>

#include "common/mutex.h"
#include "transfer/metadata_internal.h"

namespace tandem::transfer::internal {
namespace {

// The owner tag of durable keys: no store has it (store ids start at 1), so none removes them.
constexpr uint64_t kNoOwner = 0;

// One named map. Shared (shared_ptr) by the stores opened on it; freed with the last of them.
class SharedMap {
 public:
  Status Put(uint64_t owner, const std::string& key, const std::string& value)
      TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    entries_[key] = Entry{value, owner};
    return OkStatus();
  }

  StatusOr<std::string> Get(const std::string& key) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotFound("metadata key not found: " + key);
    return it->second.value;
  }

  Status Delete(const std::string& key) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    entries_.erase(key);
    return OkStatus();
  }

  std::vector<std::pair<std::string, std::string>> List(const std::string& prefix)
      TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::vector<std::pair<std::string, std::string>> out;
    // std::map is sorted by key, so the keys with `prefix` form one contiguous run.
    for (auto it = entries_.lower_bound(prefix);
         it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      out.emplace_back(it->first, it->second.value);
    }
    return out;
  }

  // Removes every key last written by `owner`.
  void RemoveOwner(uint64_t owner) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::erase_if(entries_, [owner](const auto& kv) { return kv.second.owner == owner; });
  }

 private:
  struct Entry {
    std::string value;
    uint64_t owner;  // id of the EmbeddedStore that wrote it last
  };
  Mutex mu_;
  std::map<std::string, Entry> entries_ TANDEM_GUARDED_BY(mu_);
};

// name -> map, for as long as some store holds the map.
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never freed: usable during static teardown
    return *registry;
  }

  std::shared_ptr<SharedMap> Open(const std::string& name) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::shared_ptr<SharedMap> map = maps_[name].lock();
    if (!map) {
      map = std::make_shared<SharedMap>();
      maps_[name] = map;
    }
    return map;
  }

  uint64_t NextOwnerId() TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return ++last_owner_id_;
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, std::weak_ptr<SharedMap>> maps_ TANDEM_GUARDED_BY(mu_);
  uint64_t last_owner_id_ TANDEM_GUARDED_BY(mu_) = 0;
};

class EmbeddedStore final : public MetadataStore {
 public:
  EmbeddedStore(std::shared_ptr<SharedMap> map, uint64_t id) : map_(std::move(map)), id_(id) {}
  ~EmbeddedStore() override { map_->RemoveOwner(id_); }

  Status Put(const std::string& key, const std::string& value) override {
    if (key.empty()) return InvalidArgument("metadata key must not be empty");
    return map_->Put(id_, key, value);
  }
  Status PutDurable(const std::string& key, const std::string& value) override {
    if (key.empty()) return InvalidArgument("metadata key must not be empty");
    return map_->Put(kNoOwner, key, value);
  }
  StatusOr<std::string> Get(const std::string& key) override {
    if (key.empty()) return InvalidArgument("metadata key must not be empty");
    return map_->Get(key);
  }
  Status Delete(const std::string& key) override {
    if (key.empty()) return InvalidArgument("metadata key must not be empty");
    return map_->Delete(key);
  }
  StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override {
    return map_->List(prefix);
  }

 private:
  std::shared_ptr<SharedMap> map_;
  const uint64_t id_;  // owner tag of the keys this store writes
};

}  // namespace

StatusOr<std::shared_ptr<MetadataStore>> OpenEmbeddedStore(const std::string& name) {
  Registry& registry = Registry::Get();
  std::shared_ptr<MetadataStore> store =
      std::make_shared<EmbeddedStore>(registry.Open(name), registry.NextOwnerId());
  return store;
}

}  // namespace tandem::transfer::internal
