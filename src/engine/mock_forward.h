// A forward pass that computes nothing and takes the time a cost profile says: the engine of a
// mock worker (`tandem worker --mock PROFILE`), so that the real conductor, control protocol, KV
// bookkeeping and transfers can run with dozens of workers on a few cores.
//
//   MockForward mock({.step_seconds = [&](auto batch) { return 0.03; }, .token = 42});
//   tf.SetMock(std::move(mock));  // tf.Forward now sleeps 30 ms per step, layer by layer
//
// Per step it sleeps step_seconds(batch) (a pipeline stage: its layers' share of it), spread
// evenly over the layers with the layer-done callback after each, as a real pass calls it; it
// writes no KV (what it moves is whatever the cache holds) and gives logits that make `token`
// the one a sampler draws: 0 everywhere, +30 at `token` (softmax puts all but e^-30 of the mass
// on it, so any temperature below ~3 samples it).
//
// Thread-safety: as Transformer (one step at a time; credits from the thread that runs steps).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/batch_item.h"

namespace tandem::engine {

struct MockForwardOptions {
  // Seconds of a whole forward pass (every layer) over `batch`; >= 0.
  std::function<double(std::span<const BatchItem> batch)> step_seconds;
  int32_t token = 0;  // what every row of logits says to draw; in [0, vocab)
};

class MockForward {
 public:
  explicit MockForward(MockForwardOptions options) : options_(std::move(options)) {}

  // The pass over layers [begin_layer, end_layer) of n_layers: sleeps their share of the step,
  // calls on_layer_done(l) (may be empty) after each layer's share; then, when end_layer ==
  // n_layers, writes logit_rows rows of `vocab` logits to *logits, else (T, dim) zeros to
  // *hidden_out (T = tokens in the batch).
  void Run(std::span<const BatchItem> batch, int begin_layer, int end_layer, int n_layers,
           const std::function<void(int)>& on_layer_done, int64_t logit_rows, int vocab, int dim,
           std::vector<float>* hidden_out, std::vector<float>* logits);

  // Host work done for the last step outside the pass (drawing its tokens: on this CPU ~0.2 ms
  // a sequence over a 49k vocabulary) that the profile's step time already includes (a GPU
  // engine samples inside its step): the next pass sleeps that much less (never below 0).
  void CreditHostSeconds(double seconds) { credit_s_ += seconds; }

 private:
  MockForwardOptions options_;
  double credit_s_ = 0;
};

}  // namespace tandem::engine
