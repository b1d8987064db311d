#include "engine/mock_forward.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace tandem::engine {

void MockForward::Run(std::span<const BatchItem> batch, int begin_layer, int end_layer,
                      int n_layers, const std::function<void(int)>& on_layer_done,
                      int64_t logit_rows, int vocab, int dim, std::vector<float>* hidden_out,
                      std::vector<float>* logits) {
  using Clock = std::chrono::steady_clock;
  const double full = options_.step_seconds ? std::max(0.0, options_.step_seconds(batch)) : 0;
  const double step = std::max(0.0, full - credit_s_);
  credit_s_ = 0;
  const double per_layer = n_layers > 0 ? step / n_layers : 0;
  // The outputs first (zeroing B x vocab logits is host work of its own), inside the step's time.
  const Clock::time_point start = Clock::now();
  if (end_layer < n_layers) {
    int64_t tokens = 0;
    for (const BatchItem& item : batch) tokens += static_cast<int64_t>(item.tokens.size());
    hidden_out->assign(static_cast<size_t>(tokens * dim), 0.0f);
  } else {
    constexpr float kMargin = 30;
    logits->assign(static_cast<size_t>(logit_rows * vocab), 0.0f);
    for (int64_t r = 0; r < logit_rows; ++r) (*logits)[r * vocab + options_.token] = kMargin;
  }
  // Deadlines from one start, so that the layers' sleeps do not add up their oversleeps.
  for (int l = begin_layer; l < end_layer; ++l) {
    const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(per_layer * (l - begin_layer + 1)));
    std::this_thread::sleep_until(due);
    if (on_layer_done) on_layer_done(l);
  }
}

}  // namespace tandem::engine
