// `baton-bench profile`: measures a running cluster's workers and fits the
// cost profile baton-sim reads (profile.h):
//   - prefill: one request at a time for each prompt length, max_tokens 1;
//     the time is the prefill worker's own (PhaseTimings.prefill_ms), so
//     queueing and RPC hops are not in it; fitted c0 + c1·l + c2·l²;
//   - decode: B requests at once with short prompts of P tokens and T
//     output tokens each, for each batch B; while the whole batch decodes
//     (after the last request's first token, before the first one ends)
//     every stretch of `decode_chunk_tokens` steps is one sample: the
//     median gap between tokens against the batch's mean total context
//     over the stretch (contexts grow as the answers do, so one run covers
//     many), fitted c0 + c1·Σctx + c2·B;
//   - transfer (split clusters): the prefill requests' KV bytes against the
//     prefill worker's transfer time (first byte to the last layer's
//     acknowledgement, which overlaps the prefill), fitted α + bytes/β;
//     colocated clusters move no KV, and the profile says so;
//   - neighbours (split clusters): a burst of requests sent at once, the
//     load of a saturated split cluster, and its baseline (the burst's
//     prompts with an idle decode worker before it; after it, its own
//     tail and runs of 1, 2, 4, ... and B requests of its prompts, B the
//     largest batch it decoded, decoding with an idle prefill worker,
//     timed batch by batch); the prefill steps and the decode steps
//     beside them, against the baseline, give how much a busy neighbour
//     slows each down (neighbor_slowdown, neighbors.h); the burst's
//     prompts alone, and the decode samples' largest batch run again,
//     against the fits scale them to the host's speed at the end;
//   - the KV pool and layout from GetClusterStatus.
// Each fit is validated on held-out samples (fit.h); a fit above the limit
// is an error, not a profile.
#ifndef BATON_BENCH_SIM_PROFILER_H_
#define BATON_BENCH_SIM_PROFILER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/metrics.h"
#include "bench/sim/neighbors.h"
#include "worker/engine/cost_profile.h"

namespace baton::sim {

struct ProfileOptions {
  std::vector<int> prefill_lengths = {32, 64, 128, 256, 512, 1024};
  int prefill_repeats = 2;
  std::vector<int> decode_batches = {1, 2, 4, 8, 16};
  // Prompt lengths of the decode runs: short, so the batch's prefills end
  // soon and the contexts come from the answers.
  std::vector<int> decode_contexts = {32};
  int decode_tokens = 384;
  int decode_chunk_tokens = 64;
  // The neighbour run: this many requests at once, of these lengths.
  int neighbor_requests = 32;
  int neighbor_prompt = 256;
  int neighbor_output = 64;
  // Neighbour runs (each with its baseline) whose median the profile
  // keeps (MedianNeighborEstimate); >= 1.
  int neighbor_runs = 3;
  // The workers' scheduler settings (baton-worker's defaults), which the
  // profile carries for the simulator.
  int64_t max_batch_tokens = 512;
  int64_t max_num_seqs = 64;
  double max_heldout_mape = 0.10;
  double request_timeout_s = 600;
  // The profile's name (what was measured: model, hardware, threads).
  std::string name;
};

// The steps in which every request of the batch decodes, in ms since the
// run's start: after the last first token, before the first one ends.
struct DecodeWindow {
  double start_ms = 0;
  double end_ms = 0;
};
DecodeWindow WholeBatchWindow(const std::vector<bench::RequestRecord>& records);
// One decode sample: a stretch of steps in which all `batch` requests
// decoded, the median step time and the batch's mean total context.
struct DecodeWindowSample {
  int64_t batch = 0;
  int64_t sum_context = 0;
  double step_s = 0;
};
std::vector<DecodeWindowSample> DecodeWindowSamples(
    const std::vector<bench::RequestRecord>& records, int chunk);

// Runs the measurements on `channel` (a Baton coordinator), logging each
// step and fit to `log`.
absl::StatusOr<WorkerProfile> MeasureProfile(
    std::shared_ptr<grpc::Channel> channel, const ProfileOptions& options,
    std::ostream& log);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_PROFILER_H_
