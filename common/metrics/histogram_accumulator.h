// Observations of one histogram kept locally (no lock, no atomic) by a
// single thread and added to a shared prometheus::Histogram in one step:
// for values recorded on a hot path, e.g. every token of a request.
#ifndef BATON_COMMON_METRICS_HISTOGRAM_ACCUMULATOR_H_
#define BATON_COMMON_METRICS_HISTOGRAM_ACCUMULATOR_H_

#include <cstdint>
#include <vector>

#include "prometheus/histogram.h"

namespace baton::metrics {

class HistogramAccumulator {
 public:
  // `bounds`: the histogram's bucket upper bounds, increasing (the same
  // vector the histogram was built with); must outlive the accumulator.
  explicit HistogramAccumulator(const std::vector<double>* bounds);

  // Records `count` observations of `value`.
  void Add(double value, int64_t count = 1);
  // Adds everything recorded to `histogram` (built with the same bounds)
  // and starts over empty.
  void FlushTo(prometheus::Histogram& histogram);

  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  const std::vector<double>* bounds_;
  // One per bound, then the +Inf bucket; not cumulative.
  std::vector<double> bucket_counts_;
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace baton::metrics

#endif  // BATON_COMMON_METRICS_HISTOGRAM_ACCUMULATOR_H_
