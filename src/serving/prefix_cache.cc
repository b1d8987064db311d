#include "serving/prefix_cache.h"

#include "serving/block_keys.h"

namespace tandem::serving {

PrefixCache::PrefixCache(engine::PagedKvCache* kv) : kv_(kv), held_(kv->num_blocks(), 0) {}

PrefixCache::~PrefixCache() {
  for (const auto& [key, entry] : entries_) kv_->Release(entry.block);
}

std::vector<uint64_t> PrefixCache::BlockKeys(std::span<const int32_t> tokens, int block_tokens,
                                             uint64_t seed) {
  return serving::BlockKeys(tokens, block_tokens, seed);
}

std::vector<uint64_t> PrefixCache::Keys() const {
  std::vector<uint64_t> keys;
  keys.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) keys.push_back(key);
  return keys;
}

std::vector<int32_t> PrefixCache::Match(std::span<const uint64_t> keys, int max_blocks) {
  std::vector<int32_t> blocks;
  for (size_t i = 0; i < keys.size() && static_cast<int>(i) < max_blocks; ++i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) break;
    lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    kv_->AddRef(it->second.block);
    blocks.push_back(it->second.block);
  }
  const int resumable = kv_->ResumablePrefix(blocks, static_cast<int>(blocks.size()));
  for (size_t i = resumable; i < blocks.size(); ++i) kv_->Release(blocks[i]);
  blocks.resize(resumable);
  return blocks;
}

void PrefixCache::Insert(uint64_t key, int32_t block) {
  if (entries_.count(key) != 0) return;
  kv_->AddRef(block);
  held_[block] = 1;
  lru_.push_front(key);
  entries_.emplace(key, Entry{block, lru_.begin()});
  ++version_;
}

int PrefixCache::UnsharedBlocks() const {
  int n = 0;
  for (const auto& [key, entry] : entries_) n += kv_->ref_count(entry.block) == 1;
  return n;
}

int PrefixCache::Evict(int n) {
  int freed = 0;
  for (auto it = lru_.end(); it != lru_.begin() && freed < n;) {
    --it;
    auto entry = entries_.find(*it);
    if (kv_->ref_count(entry->second.block) != 1) continue;  // a sequence still uses it
    held_[entry->second.block] = 0;
    kv_->Release(entry->second.block);
    entries_.erase(entry);
    ++version_;
    it = lru_.erase(it);
    ++freed;
  }
  return freed;
}

void PrefixCache::UnpinWindows() {
  for (uint8_t& h : held_) h = h == 2 ? 1 : h;
}

int PrefixCache::EvictWindows(int n) {
  int freed = 0;
  for (auto it = lru_.rbegin(); it != lru_.rend() && freed < n; ++it) {
    const int32_t block = entries_.at(*it).block;
    if (kv_->ref_count(block) != 1 || !kv_->HasWindow(block)) continue;
    kv_->DropWindow(block);
    ++freed;
  }
  return freed;
}

}  // namespace tandem::serving
