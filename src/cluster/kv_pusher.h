// The prefill side of a KV hand-off: observes the forward pass of one request and writes each
// layer of its KV blocks into the decode worker's reserved blocks through the transfer engine
// as soon as the layer is computed, so that the transfer overlaps the layers still computing.
//
// The layer slices of one block are the transfer unit (engine::PagedKvCache's layout, on both
// sides). Sliding layers' slices go only to the blocks where the decode side keeps a window
// (KvTarget::window_blocks): the window the first decode step reads. A block partly filled by one
// prefill chunk is sent again, whole, by the next chunk. The last layer of the last chunk is held
// back until the first token is sampled: it is sent with the notification that tells the decode
// worker the KV is complete and what the first token is, after every earlier batch has landed.
// Blocks below target.skip_blocks are never sent: the decode side holds that prefix already.
//
// Thread-safety: OnLayerWritten and Finish run on the engine's loop thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "engine/kv_cache.h"
#include "serving/local_backend.h"
#include "transfer/transfer_engine.h"

namespace tandem::cluster {

class KvPusher : public serving::KvObserver {
 public:
  // te, kv: not owned, outlive the pusher. remote: the decode worker's opened KV segment;
  // target.blocks must cover n_prompt positions. Each batch fails `batch_timeout` after it is
  // submitted, and none outlives `deadline` (the request's).
  KvPusher(transfer::TransferEngine* te, engine::PagedKvCache* kv, transfer::SegmentHandle remote,
           KvTarget target, int n_prompt, transfer::Clock::time_point deadline,
           transfer::Clock::duration batch_timeout = std::chrono::seconds(10));
  ~KvPusher() override;

  // Checks that both sides agree on the KV geometry and the reservation covers the prompt.
  static Status CheckTarget(const engine::PagedKvCache& kv, const KvTarget& target, int n_prompt);

  void OnLayerWritten(int layer, std::span<const int32_t> blocks, int first_pos,
                      int end_pos) override;

  // After the first token: sends the held-back layer with `notification`, waits for every batch
  // (never past the deadline) and frees them. The first failure is returned.
  Status Finish(const std::string& notification);

  // Waits for every batch submitted so far (never past the deadline) and returns the first
  // failure: for a pipeline stage that ends before the model's last layer, its part is then
  // complete (protocol.h PipelineStage).
  Status Flush();

  uint64_t bytes_sent() const { return bytes_; }
  // Seconds Finish waited for transfers after the last layer was computed.
  double tail_seconds() const { return tail_seconds_; }
  // The state of the first failed batch, if any (to count failures and timeouts apart).
  transfer::TransferState failure_state() const { return failure_state_; }

 private:
  void Submit(std::vector<transfer::TransferRequest> requests, const std::string& notification);
  void WaitAll();

  transfer::TransferEngine* te_;
  engine::PagedKvCache* kv_;
  transfer::SegmentHandle remote_;
  KvTarget target_;
  int n_prompt_;
  transfer::Clock::time_point deadline_;
  transfer::Clock::duration batch_timeout_;
  std::vector<int> sent_upto_;                   // per layer: positions already submitted
  std::vector<transfer::BatchId> batches_;       // submitted, not yet waited for
  std::vector<transfer::TransferRequest> held_;  // last layer of the last chunk
  Status status_;                                // first error
  transfer::TransferState failure_state_ = transfer::TransferState::kCompleted;
  uint64_t bytes_ = 0;
  double tail_seconds_ = 0;
};

}  // namespace tandem::cluster
