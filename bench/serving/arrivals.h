// When each request of a benchmark is sent: a schedule precomputed from the
// seed, so two runs with the same flags send at the same offsets.
#ifndef BATON_BENCH_SERVING_ARRIVALS_H_
#define BATON_BENCH_SERVING_ARRIVALS_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::bench {

struct ArrivalOptions {
  // Mean requests per second; +infinity sends every request at time 0.
  // Finite values must be > 0.
  double request_rate = std::numeric_limits<double>::infinity();
  // Shape of the gamma distribution of the gaps between requests, > 0:
  // 1 is a Poisson process, < 1 burstier, > 1 more uniform. The mean gap is
  // 1 / request_rate whatever the burstiness.
  double burstiness = 1.0;
};

// INVALID_ARGUMENT naming the flag when a field is out of range.
absl::Status ValidateArrivalOptions(const ArrivalOptions& options);

// Send offsets in seconds from the start of the benchmark, one per request,
// non-decreasing; the first gap is drawn too (offset[0] > 0 for a finite
// rate), as a process that was already running would.
absl::StatusOr<std::vector<double>> ArrivalOffsets(
    int num_requests, const ArrivalOptions& options, uint64_t seed);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_ARRIVALS_H_
