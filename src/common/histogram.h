// A cumulative-bucket histogram with fixed upper bounds, as Prometheus exposes them: the front
// door's latency histograms and the conductor's prediction errors use it.
//
// Thread-safety: thread-safe (one mutex; Observe is a few instructions under it).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending, +Inf implied
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // per bound: observations <= it; `count` for +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), size bounds_ + 1
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace tandem
