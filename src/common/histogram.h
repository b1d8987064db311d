// A cumulative-bucket histogram with fixed upper bounds, as Prometheus exposes them: the front
// door's latency histograms and the conductor's prediction errors use it.
//
// Thread-safety: thread-safe (one mutex; Observe is a few instructions under it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace tandem {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending, +Inf implied
  void Observe(double value) TANDEM_EXCLUDES(mu_);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound: observations <= it; `count` for +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const TANDEM_EXCLUDES(mu_);

 private:
  const std::vector<double> bounds_;  // immutable: read without the lock
  mutable Mutex mu_;
  // Per bucket (not cumulative), size bounds_ + 1.
  std::vector<uint64_t> counts_ TANDEM_GUARDED_BY(mu_);
  double sum_ TANDEM_GUARDED_BY(mu_) = 0;
  uint64_t count_ TANDEM_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem
