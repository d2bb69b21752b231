// baton-sim's discrete-event simulator: a cluster of simulated workers whose
// prefill, decode steps and KV transfers take the time a WorkerProfile
// predicts, driven by the coordinator's own admission (coordinator/
// admission.h) and routing policy (coordinator/routing_policy.h) — the same
// code baton-coordinator runs, fed the load the simulated workers hold.
//
// What it models, per request:
//   arrival → admission (refused: RESOURCE_EXHAUSTED at arrival) →
//   split: a decode worker's KV reservation for prompt + output (none with
//   room: the line of the worker PickDecodeQueue names, first come first
//   served) → the prefill worker the policy picks (its steps composed as
//   the engine's Scheduler composes them, step_queue.h: prompts chunked
//   under max_batch_tokens, first come first served, up to max_num_seqs at
//   once) → first token at the end of the step that runs the prompt's last
//   chunk → the KV transfer, which overlaps that step layer by layer and
//   so ends at max(its end, its start + transfer time) → the decode
//   worker's running sequences (one token each per step, within the token
//   budget) → the last token frees the reservation. With prompt piece ids,
//   every worker caches full prompt blocks (prefix_model.h): routing weighs the
//   coordinator's PrefixIndex of them, a prefill computes only what its
//   worker lacks (a fully cached prompt still the block of its last
//   token, as the engine), and a KV transfer carries only the blocks its
//   decode worker lacks (never that last block either).
//   colocated (`both` workers only): the worker's queue; a prompt starts
//   when its prompt + output blocks fit; each step decodes the running
//   sequences and prefills chunks of prompts (step_queue.h), and lasts the
//   sum of both times.
// Workers that share a host (workers_per_host) slow each other's steps by
// the profile's neighbor_slowdown (its prefill and its decode part each by
// its own fraction), as the steps start.
// The coordinator's view is exact (no heartbeat lag); prefill rates for
// admission are each worker's measured rate, as the real engine reports
// it (worker/engine/prefill_rate.h). Ties break by order of events, so a
// run is a function of its inputs.
#ifndef BATON_BENCH_SIM_SIMULATOR_H_
#define BATON_BENCH_SIM_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/metrics.h"
#include "coordinator/admission.h"
#include "worker/engine/cost_profile.h"

namespace baton::sim {

struct SimRequest {
  SimRequest() = default;
  SimRequest(double arrival, int64_t input, int64_t output)
      : arrival_s(arrival), input_len(input), output_len(output) {}

  double arrival_s = 0;
  int64_t input_len = 1;   // >= 1
  int64_t output_len = 1;  // >= 1, the first token included
  // Ids of the prompt's consecutive pieces of SimOptions::piece_tokens
  // tokens (prefix_model.h); empty: its prompt shares no prefix.
  std::vector<int64_t> piece_ids;
};

struct SimOptions {
  // Workers by role; prefill > 0 needs decode > 0 (split serving), else
  // both > 0 (colocated).
  int prefill = 1;
  int decode = 1;
  int both = 0;
  WorkerProfile profile;
  // "least_loaded" or "round_robin", as baton-coordinator's --policy.
  std::string policy = "least_loaded";
  coordinator::AdmissionOptions admission;
  // Workers cache prompt blocks by prefix (prefix_model.h), as the engine's
  // --prefix_cache=on; pieces of piece_tokens (a multiple of the block size).
  bool prefix_cache = true;
  int64_t piece_tokens = 512;
  // Split serving: a request whose prompt a decode worker with room holds
  // all but at most this many tokens of is served colocated there, as
  // baton-coordinator's --local_prefill_tokens (0: always split).
  int64_t local_prefill_tokens = 0;
  // Workers that share one host, in the order prefill, decode, colocated:
  // a step that starts while k others of its host compute takes
  // 1 + k · profile.neighbor_slowdown.prefill times longer to prefill and
  // 1 + k · .decode times longer to decode. 1: every worker alone.
  int workers_per_host = 1;
};

// Parses "1P1D", "2C", "4P12D" into prefill / decode / both counts.
absl::Status ParseShape(const std::string& shape, SimOptions* options);

struct SimResult {
  // One per request, in input order, as baton-bench records them.
  std::vector<bench::RequestRecord> records;
  // The last event's time.
  double end_s = 0;
  int64_t events = 0;
  // Prompt tokens in all and those a prefix cache held (not computed).
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t evicted_blocks = 0;
};

// INVALID_ARGUMENT naming the problem: a shape without split or colocated
// workers, bad admission options, piece_tokens not a multiple of the block
// size, workers_per_host < 1, a request with a length < 1, out of order, or
// larger than a worker's KV pool. (The policy is checked by Simulate.)
absl::Status ValidateSimInput(const SimOptions& options,
                              const std::vector<SimRequest>& requests);

// INVALID_ARGUMENT for a bad shape, policy or request.
absl::StatusOr<SimResult> Simulate(const SimOptions& options,
                                   const std::vector<SimRequest>& requests);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_SIMULATOR_H_
