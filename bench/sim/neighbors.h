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
// Both ratios are taken against a baseline: the same kinds of steps timed
// with an idle neighbour right before the burst (NeighborBaseline), not
// against the fits alone, which were measured minutes earlier on a host
// whose speed drifts by more than the effect (docs/planning.md).
#ifndef BATON_BENCH_SIM_NEIGHBORS_H_
#define BATON_BENCH_SIM_NEIGHBORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/metrics.h"
#include "worker/engine/cost_profile.h"

namespace baton::sim {

// Decode gaps timed against the decode fit (each request's gaps but its
// first, which also holds the KV handoff), by the batch decoding at each
// gap's middle: a step of batch B gives B gaps.
struct DecodeTimes {
  struct Cell {
    double measured_s = 0;
    double predicted_s = 0;
    int gaps = 0;
    double ratio() const {
      return predicted_s > 0 ? measured_s / predicted_s : 1;
    }
  };
  // A batch with fewer gaps than this is too few to stand for its own.
  static constexpr int kMinGaps = 20;
  std::map<int64_t, Cell> by_batch;

  void Add(const DecodeTimes& other);
  int gaps() const;
  // Measured over predicted over every batch (1 with none).
  double Ratio() const;
  // Measured over predicted at `batch`, or where it has fewer than
  // kMinGaps gaps at the nearest batch with as many (the smaller of two as
  // near); 1 with none.
  double RatioAt(int64_t batch) const;
};

// Measured over fitted time of steps whose neighbour idles: the speed of
// the host at the burst against the profile's (empty: the fits). The
// decode steps are taken batch by batch: the fit's error differs between
// batches by as much as the slowdown (on a one-thread CPU worker, steps of
// one request read 1.07x the fit where steps of two read 0.98x).
struct NeighborBaseline {
  double prefill_ratio = 1;  // a burst of prompts alone (PrefillBurstRatio)
  DecodeTimes decode;        // requests decoding alone (DecodeAloneTimes)
};

struct NeighborEstimate {
  // The baseline at the burst: its prefill ratio, and its decode ratio at
  // the burst's batches (weighted as the burst's fitted decode time is).
  double prefill_alone = 1;
  double decode_alone = 1;
  // The decode samples' largest batch timed again against the fit (the
  // profiler's; 1 otherwise): the decode fit's level (profiler.h).
  double decode_level = 1;
  double prefill_ratio = 0;
  double decode_ratio = 0;
  double decode_busy = 0;   // fraction of the window the decode worker computed
  double decode_batch = 0;  // requests decoding in a timed step, on average
  int prefill_steps = 0;    // steps timed (after the first)
  int decode_steps = 0;     // gaps timed
  DecodeTimes decode;       // the burst's decode gaps
  WorkerProfile::NeighborSlowdown slowdown;
  std::string Describe() const;
};

// A burst's prefill steps, from the second first token to the last,
// against the prefill fit for the prompts of each (told apart by their
// first tokens); *steps: how many were timed. FAILED_PRECONDITION with
// fewer than two.
absl::StatusOr<double> PrefillBurstRatio(
    const std::vector<bench::RequestRecord>& records,
    const WorkerProfile& profile, int* steps);

// Requests decoding with an idle prefill worker (sent at once, or a
// burst's tail): their gaps after the last first token, timed as a burst's
// are.
DecodeTimes DecodeAloneTimes(const std::vector<bench::RequestRecord>& records,
                             const WorkerProfile& profile);

// Several neighbour runs in one: the median of each ratio and slowdown
// (one run's estimate moves by more than the effect between runs on a
// host that drifts). The counts are the runs' totals, the decode times
// their sum. `runs` not empty.
NeighborEstimate MedianNeighborEstimate(
    const std::vector<NeighborEstimate>& runs);

// FAILED_PRECONDITION when the burst gives too little to time (fewer than
// two prefill steps, or no decode step inside the window).
absl::StatusOr<NeighborEstimate> EstimateNeighborSlowdown(
    const std::vector<bench::RequestRecord>& records,
    const WorkerProfile& profile, const NeighborBaseline& baseline = {});

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_NEIGHBORS_H_
