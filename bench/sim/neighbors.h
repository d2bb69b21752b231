// The neighbour slowdown of two workers on one host (the profile's
// neighbor_slowdown), estimated from a burst run on a split cluster: many
// requests sent at once, so the prefill worker computes one step after
// another while the decode worker decodes the requests it has received —
// the load of a saturated split cluster. Between the first and the last
// first token:
//   - the prefill worker's steps take `prefill_ratio` times what the fit
//     predicts (the steps are told apart by their first tokens); the
//     excess over 1, divided by the fraction of that time the decode worker
//     computed, is the prefill slowdown;
//   - the decode steps (each request's gaps between tokens, but its first,
//     which also holds the KV handoff) take `decode_ratio` times what the
//     fit predicts for the batch and contexts decoding then; the prefill
//     worker computed all along, so the excess is the decode slowdown.
#ifndef BATON_BENCH_SIM_NEIGHBORS_H_
#define BATON_BENCH_SIM_NEIGHBORS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/metrics.h"
#include "worker/engine/cost_profile.h"

namespace baton::sim {

struct NeighborEstimate {
  double prefill_ratio = 0;
  double decode_ratio = 0;
  double decode_busy = 0;  // fraction of the window the decode worker computed
  int prefill_steps = 0;   // steps timed (after the first)
  int decode_steps = 0;    // gaps timed
  WorkerProfile::NeighborSlowdown slowdown;
  std::string Describe() const;
};

// FAILED_PRECONDITION when the burst gives too little to time (fewer than
// two prefill steps, or no decode step inside the window).
absl::StatusOr<NeighborEstimate> EstimateNeighborSlowdown(
    const std::vector<bench::RequestRecord>& records,
    const WorkerProfile& profile);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_NEIGHBORS_H_
