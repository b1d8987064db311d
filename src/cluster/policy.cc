#include "cluster/policy.h"

#include <algorithm>
#include <tuple>

namespace tandem::cluster {
namespace {

// Lower is better.
auto LoadKey(const WorkerLoad& w) { return std::make_tuple(w.inflight, -w.kv_free_blocks, w.name); }

}  // namespace

Placement PlaceRequest(std::span<const WorkerLoad> workers, const RequestShape& request,
                       std::span<const int> exclude_prefill) {
  Placement p;
  bool any_decoder = false;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const WorkerLoad& w = workers[i];
    if (!w.healthy || !CanDecode(w.role)) continue;
    any_decoder = true;
    const int bt = std::max(1, w.block_tokens);
    const int need = (request.prompt_tokens + 1 + bt - 1) / bt;
    if (need > w.kv_free_blocks) continue;
    if (p.decode < 0 || LoadKey(w) < LoadKey(workers[p.decode])) p.decode = i;
  }
  if (p.decode < 0) {
    p.reject_reason = any_decoder ? "no decode worker has room for the prompt's KV cache now"
                                  : "no decode worker is available";
    return p;
  }
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const WorkerLoad& w = workers[i];
    if (!w.healthy || w.role != Role::kPrefill || i == p.decode) continue;
    if (std::find(exclude_prefill.begin(), exclude_prefill.end(), i) != exclude_prefill.end()) {
      continue;
    }
    if (p.prefill < 0 || LoadKey(w) < LoadKey(workers[p.prefill])) p.prefill = i;
  }
  p.local = p.prefill < 0;
  return p;
}

}  // namespace tandem::cluster
