#include "cluster/kv_pusher.h"

#include <algorithm>

namespace tandem::cluster {

using transfer::BatchStatus;
using transfer::Clock;
using transfer::TransferRequest;
using transfer::TransferState;

KvPusher::KvPusher(transfer::TransferEngine* te, engine::PagedKvCache* kv,
                   transfer::SegmentHandle remote, KvTarget target, int n_prompt,
                   Clock::time_point deadline, Clock::duration batch_timeout)
    : te_(te),
      kv_(kv),
      remote_(remote),
      target_(std::move(target)),
      n_prompt_(n_prompt),
      deadline_(deadline),
      batch_timeout_(batch_timeout),
      sent_upto_(kv->shape().n_layers, target_.skip_blocks * kv->shape().block_tokens) {}

KvPusher::~KvPusher() { WaitAll(); }

Status KvPusher::CheckTarget(const engine::PagedKvCache& kv, const KvTarget& target, int n_prompt) {
  const auto& shape = kv.shape();
  if (target.block_tokens != shape.block_tokens || target.n_layers != shape.n_layers ||
      target.layer_slice_bytes != kv.LayerSliceBytes()) {
    return FailedPrecondition(
        "the decode worker's KV geometry (" + std::to_string(target.n_layers) + " layers, " +
        std::to_string(target.block_tokens) + "-token blocks, " +
        std::to_string(target.layer_slice_bytes) + "-byte slices) differs from this worker's (" +
        std::to_string(shape.n_layers) + ", " + std::to_string(shape.block_tokens) + ", " +
        std::to_string(kv.LayerSliceBytes()) + "): the workers must serve the same model");
  }
  if (target.skip_blocks < 0 || target.skip_blocks >= kv.BlocksFor(n_prompt)) {
    return InvalidArgument("the reservation skips " + std::to_string(target.skip_blocks) +
                           " blocks of a prompt of " + std::to_string(kv.BlocksFor(n_prompt)) +
                           " (at least its last block must be written)");
  }
  if (static_cast<int64_t>(target.blocks.size()) < kv.BlocksFor(n_prompt)) {
    return InvalidArgument("the reservation holds " + std::to_string(target.blocks.size()) +
                           " blocks; the prompt needs " + std::to_string(kv.BlocksFor(n_prompt)));
  }
  const bool sliding = shape.NumSlidingLayers() > 0;
  if (target.window_tokens != shape.window_tokens ||
      (sliding && target.window_blocks.size() != target.blocks.size()) ||
      (!sliding && !target.window_blocks.empty())) {
    return FailedPrecondition(
        "the decode worker's sliding window (" + std::to_string(target.window_tokens) +
        " tokens, " + std::to_string(target.window_blocks.size()) + " window blocks for " +
        std::to_string(target.blocks.size()) + " blocks) does not match this worker's (" +
        std::to_string(shape.window_tokens) + " tokens)");
  }
  return OkStatus();
}

void KvPusher::OnLayerWritten(int layer, std::span<const int32_t> blocks, int first_pos,
                              int end_pos) {
  if (!status_.ok() || layer < 0 || layer >= static_cast<int>(sent_upto_.size())) return;
  const int bt = kv_->shape().block_tokens;
  // Everything not yet sent for this layer: a cached prefix (below first_pos) goes with the
  // first chunk; a block the previous chunk left partly filled is sent again whole.
  const int first_block = sent_upto_[layer] / bt;
  const int end_block = std::min<int>((end_pos + bt - 1) / bt, static_cast<int>(blocks.size()));
  // A chunk that ends inside the prefix the decode side holds (skip_blocks) sends nothing.
  if (end_block <= first_block) return;
  sent_upto_[layer] = std::max(sent_upto_[layer], end_pos);
  (void)first_pos;
  std::vector<TransferRequest> requests;
  requests.reserve(end_block - first_block);
  const size_t slice = kv_->LayerSliceBytes();
  const bool sliding = kv_->shape().IsSliding(layer);
  for (int b = first_block; b < end_block; ++b) {
    if (b >= static_cast<int>(target_.blocks.size())) {
      status_ = OutOfRange("the prompt outgrew its KV reservation");
      return;
    }
    // A sliding layer's block goes only where the decode side keeps its window.
    const int32_t remote_window = sliding ? target_.window_blocks[b] : -1;
    if (sliding && remote_window < 0) continue;
    if (sliding && !kv_->HasWindow(blocks[b])) {
      status_ = Internal("the sliding-window KV of block " + std::to_string(b) +
                         " was released before it was sent");
      return;
    }
    TransferRequest r;
    r.op = transfer::OpCode::kWrite;
    r.local = kv_->data() + kv_->LayerSliceOffset(blocks[b], layer);
    r.segment = remote_;
    r.remote_offset =
        kv_->SliceOffsetIn(target_.window_arena_offset, target_.blocks[b], remote_window, layer);
    r.length = slice;
    requests.push_back(r);
  }
  if (requests.empty()) return;
  const bool last = layer + 1 == static_cast<int>(sent_upto_.size()) && end_pos >= n_prompt_;
  if (last) {
    held_ = std::move(requests);  // goes with the notification, after the first token
    return;
  }
  Submit(std::move(requests), {});
}

void KvPusher::Submit(std::vector<TransferRequest> requests, const std::string& notification) {
  auto batch =
      te_->SubmitBatch(requests, std::min(deadline_, Clock::now() + batch_timeout_), notification);
  if (!batch.ok()) {
    if (status_.ok()) status_ = batch.status().WithContext("KV transfer refused");
    failure_state_ = TransferState::kFailed;
    return;
  }
  for (const auto& r : requests) bytes_ += r.length;
  batches_.push_back(*batch);
}

void KvPusher::WaitAll() {
  for (transfer::BatchId id : batches_) {
    const BatchStatus s = te_->WaitBatch(id);
    if (s.state != TransferState::kCompleted && status_.ok()) {
      failure_state_ = s.timed_out > 0 ? TransferState::kTimedOut : TransferState::kFailed;
      status_ = (s.first_error.ok() ? Internal("KV transfer did not complete") : s.first_error)
                    .WithContext("KV transfer to " + target_.decode_worker);
    }
    (void)te_->FreeBatch(id);
  }
  batches_.clear();
}

Status KvPusher::Flush() {
  WaitAll();
  return status_;
}

Status KvPusher::Finish(const std::string& notification) {
  const auto start = Clock::now();
  // Every earlier layer must have landed before the notification can say "complete".
  WaitAll();
  if (status_.ok()) {
    if (held_.empty()) {
      status_ = Internal("the last layer of the prompt was never computed");
    } else {
      Submit(std::move(held_), notification);
      held_.clear();
      WaitAll();
    }
  }
  tail_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  return status_;
}

}  // namespace tandem::cluster
