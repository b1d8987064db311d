#include "engine/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/check.h"

namespace tandem::engine {

int KvCacheShape::NumSlidingLayers() const {
  return static_cast<int>(std::count(sliding.begin(), sliding.end(), true));
}

int KvCacheShape::WindowBlocksFor(int sequences, int step_tokens) const {
  if (NumSlidingLayers() == 0) return 0;
  // A sequence computing k positions from p spans positions [p - window + 1, p + k), at most
  // ceil((window - 1 + k) / bt) + 1 <= ceil((window - 1) / bt) + 2 + ceil(k / bt) blocks, and
  // the k of one step add up to step_tokens.
  const int64_t behind = (int64_t{window_tokens} - 1 + block_tokens - 1) / block_tokens + 2;
  const int64_t step = (int64_t{std::max(step_tokens, 1)} + block_tokens - 1) / block_tokens;
  return static_cast<int>(std::min<int64_t>(sequences * behind + step, 1 << 30));
}

void KvMemoryDeleter::operator()(uint8_t* p) const {
  if (owned) std::free(p);
}

PagedKvCache::PagedKvCache(const KvCacheShape& shape)
    : shape_(shape), layer_slice_bytes_(static_cast<size_t>(shape.SliceBytes())) {
  kind_index_.resize(std::max(shape.n_layers, 0));
  for (int l = 0; l < shape.n_layers; ++l)
    kind_index_[l] = shape.IsSliding(l) ? n_sliding_++ : n_global_++;
}

namespace {

Status CheckShape(const KvCacheShape& shape) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_tokens <= 0 || shape.num_blocks <= 0) {
    return InvalidArgument("KV cache shape has a non-positive dimension");
  }
  if (!shape.sliding.empty()) {
    if (static_cast<int>(shape.sliding.size()) != shape.n_layers) {
      return InvalidArgument("the KV cache's sliding-layer list does not name every layer");
    }
    if (shape.NumSlidingLayers() > 0) {
      if (shape.window_tokens < 2) return InvalidArgument("a sliding window needs >= 2 tokens");
      const int one = std::min(shape.num_blocks, shape.WindowBlocksFor(1, 1));
      if (shape.num_window_blocks < one) {
        return InvalidArgument("the window arena (" + std::to_string(shape.num_window_blocks) +
                               " blocks) cannot hold one sequence's window (" +
                               std::to_string(one) + " blocks)");
      }
    }
  }
  if (shape.NumSlidingLayers() == 0 && shape.num_window_blocks != 0) {
    return InvalidArgument("window blocks without sliding layers");
  }
  return OkStatus();
}

}  // namespace

size_t PagedKvCache::RequiredBytes(const KvCacheShape& shape) {
  return (PagedKvCache(shape).SizeBytes() + 63) / 64 * 64;
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvCacheShape& shape) {
  TANDEM_RETURN_IF_ERROR(CheckShape(shape));
  const size_t bytes = RequiredBytes(shape);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) {
    return ResourceExhausted("cannot allocate " + std::to_string(bytes >> 20) +
                             " MiB for the KV cache");
  }
  auto kv = CreateOn(shape, p, bytes);
  if (!kv.ok()) {
    std::free(p);
    return kv.status();
  }
  (*kv)->data_.get_deleter().owned = true;
  return kv;
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::CreateOn(const KvCacheShape& shape,
                                                               uint8_t* memory, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(CheckShape(shape));
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % 64 != 0) {
    return InvalidArgument("KV cache memory must be non-null and 64-byte aligned");
  }
  if (bytes < RequiredBytes(shape)) {
    return InvalidArgument("KV cache memory holds " + std::to_string(bytes) + " bytes; " +
                           std::to_string(RequiredBytes(shape)) + " needed");
  }
  std::unique_ptr<PagedKvCache> kv(new PagedKvCache(shape));
  std::memset(memory, 0, RequiredBytes(shape));
  kv->data_ = std::unique_ptr<uint8_t, KvMemoryDeleter>(memory, KvMemoryDeleter{false});
  kv->refs_.assign(shape.num_blocks, 0);
  kv->window_of_.assign(shape.num_blocks, -1);
  kv->free_.reserve(shape.num_blocks);
  for (int32_t b = shape.num_blocks - 1; b >= 0; --b) kv->free_.push_back(b);
  kv->free_window_.reserve(shape.num_window_blocks);
  for (int32_t w = shape.num_window_blocks - 1; w >= 0; --w) kv->free_window_.push_back(w);
  return kv;
}

StatusOr<std::vector<int32_t>> PagedKvCache::Allocate(int n) {
  if (n < 0 || n > num_free()) {
    return ResourceExhausted("KV cache: " + std::to_string(n) + " blocks wanted, " +
                             std::to_string(num_free()) + " free");
  }
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (int32_t b : out) refs_[b] = 1;
  return out;
}

void PagedKvCache::AddRef(int32_t block) { ++refs_[block]; }

void PagedKvCache::Release(int32_t block) {
  if (refs_[block] <= 0) return;  // double release is ignored rather than corrupting the pool
  if (--refs_[block] == 0) {
    DropWindow(block);
    free_.push_back(block);
  }
}

void PagedKvCache::Release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) Release(b);
}

int32_t PagedKvCache::CheckedWindow(int32_t block) const {
  const int32_t w = window_of_[block];
  TANDEM_CHECK(w >= 0) << "block " << block << " has no window storage for a sliding layer";
  return w;
}

int PagedKvCache::WindowStartBlock(int64_t pos) const {
  if (n_sliding_ == 0) return 0;
  const int64_t start = std::max<int64_t>(0, pos - shape_.window_tokens + 1);
  return static_cast<int>(start / shape_.block_tokens);
}

int PagedKvCache::MissingWindows(std::span<const int32_t> table, int64_t first_pos,
                                 int64_t end_pos) const {
  if (n_sliding_ == 0 || end_pos <= first_pos) return 0;
  const int end = std::min(BlocksFor(end_pos), static_cast<int>(table.size()));
  int need = 0;
  for (int i = static_cast<int>(first_pos / shape_.block_tokens); i < end; ++i)
    need += window_of_[table[i]] < 0;
  return need;
}

Status PagedKvCache::AttachWindow(std::span<const int32_t> table, int64_t first_pos,
                                  int64_t end_pos) {
  const int need = MissingWindows(table, first_pos, end_pos);
  if (need == 0) return OkStatus();
  const int first = static_cast<int>(first_pos / shape_.block_tokens);
  const int end = std::min(BlocksFor(end_pos), static_cast<int>(table.size()));
  if (need > num_free_window()) {
    return ResourceExhausted("KV window arena: " + std::to_string(need) + " blocks wanted, " +
                             std::to_string(num_free_window()) + " free");
  }
  for (int i = first; i < end; ++i) {
    if (window_of_[table[i]] >= 0) continue;
    window_of_[table[i]] = free_window_.back();
    free_window_.pop_back();
  }
  return OkStatus();
}

void PagedKvCache::DropWindow(int32_t block) {
  if (window_of_[block] < 0) return;
  free_window_.push_back(window_of_[block]);
  window_of_[block] = -1;
}

int PagedKvCache::TrimWindow(std::span<const int32_t> table, int64_t next_pos,
                             const std::function<int(int32_t)>& passive_refs) {
  if (n_sliding_ == 0) return 0;
  const int end = std::min(WindowStartBlock(next_pos), static_cast<int>(table.size()));
  int dropped = 0;
  for (int i = 0; i < end; ++i) {
    const int32_t b = table[i];
    if (window_of_[b] < 0) continue;
    if (refs_[b] - (passive_refs ? passive_refs(b) : 0) != 1) continue;
    DropWindow(b);
    ++dropped;
  }
  return dropped;
}

int PagedKvCache::ResumablePrefix(std::span<const int32_t> table, int n_blocks) const {
  n_blocks = std::min(n_blocks, static_cast<int>(table.size()));
  if (n_sliding_ == 0) return n_blocks;
  for (int n = n_blocks; n > 0; --n) {
    bool stored = true;
    for (int i = WindowStartBlock(int64_t{n} * shape_.block_tokens); i < n && stored; ++i)
      stored = window_of_[table[i]] >= 0;
    if (stored) return n;
  }
  return 0;
}

Status PagedKvCache::CheckWindow(std::span<const int32_t> table, int64_t first_pos,
                                 int64_t end_pos) const {
  if (n_sliding_ == 0) return OkStatus();
  const int end = std::min(BlocksFor(end_pos), static_cast<int>(table.size()));
  for (int i = WindowStartBlock(first_pos); i < end; ++i) {
    if (window_of_[table[i]] < 0) {
      return FailedPrecondition("block " + std::to_string(i) + " of the sequence (positions from " +
                                std::to_string(int64_t{i} * shape_.block_tokens) +
                                ") has no sliding-window KV storage");
    }
  }
  return OkStatus();
}

}  // namespace tandem::engine
