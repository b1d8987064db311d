// Placement of a request on a prefill and a decode worker: a pure function over a snapshot of
// the cluster, so that it is tested without sockets and replaced without touching the plumbing.
// This one is load-aware only (fewest requests in flight); cache- and SLO-aware placement
// replaces it later with the same signature.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cluster/protocol.h"

namespace tandem::cluster {

// What the conductor knows of one worker at placement time.
struct WorkerLoad {
  std::string name;
  Role role = Role::kMixed;
  bool healthy = false;
  int inflight = 0;          // requests the conductor has placed there and not finished
  int kv_free_blocks = 0;    // free + reclaimable (cached) blocks at the last heartbeat
  int block_tokens = 16;
};

struct RequestShape {
  int prompt_tokens = 0;
  int max_tokens = 0;
};

struct Placement {
  int prefill = -1;          // index into the snapshot; -1 with `local`
  int decode = -1;           // index into the snapshot; -1 when rejected
  bool local = false;        // no prefill worker: the decode worker computes the prompt itself
  std::string reject_reason; // non-empty when no worker can take the request
};

// Picks the healthy decode-capable worker with the fewest requests in flight among those whose
// KV cache can hold the prompt (ties: fewer used blocks, then name), and likewise a healthy
// prefill-capable worker other than the decode worker. Without any healthy prefill worker the
// request runs locally on the decode worker (`local`). Without a decode worker it is rejected.
Placement PlaceRequest(std::span<const WorkerLoad> workers, const RequestShape& request,
                       std::span<const int> exclude_prefill = {});

}  // namespace tandem::cluster
