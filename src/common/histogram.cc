#include "common/histogram.h"

#include <algorithm>

namespace tandem {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Get() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  MutexLock lock(&mu_);
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

}  // namespace tandem
