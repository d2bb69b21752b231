#include "common/metrics/histogram_accumulator.h"

#include <algorithm>

namespace baton::metrics {

HistogramAccumulator::HistogramAccumulator(const std::vector<double>* bounds)
    : bounds_(bounds), bucket_counts_(bounds->size() + 1, 0.0) {}

void HistogramAccumulator::Add(double value, int64_t count) {
  if (count <= 0) return;
  // The first bucket whose upper bound is >= value (Prometheus' le).
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_->begin(), bounds_->end(), value) -
      bounds_->begin());
  bucket_counts_[bucket] += static_cast<double>(count);
  count_ += count;
  sum_ += value * static_cast<double>(count);
}

void HistogramAccumulator::FlushTo(prometheus::Histogram& histogram) {
  if (count_ == 0) return;
  histogram.ObserveMultiple(bucket_counts_, sum_);
  std::fill(bucket_counts_.begin(), bucket_counts_.end(), 0.0);
  count_ = 0;
  sum_ = 0;
}

}  // namespace baton::metrics
