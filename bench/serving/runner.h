// Sends a workload to a Baton server (baton.v1.Baton/Generate, one stream
// per prompt) on a precomputed arrival schedule and records what each
// request measured. The calling thread schedules sends; gRPC's callback
// threads timestamp every message as it arrives and do nothing else.
#ifndef BATON_BENCH_SERVING_RUNNER_H_
#define BATON_BENCH_SERVING_RUNNER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/api.pb.h"
#include "bench/serving/arrivals.h"
#include "bench/serving/dataset.h"
#include "bench/serving/metrics.h"

namespace baton::bench {

struct RunnerOptions {
  // --- behaviour ---
  // GenerateRequest.model; empty: the only model served.
  std::string model;
  ArrivalOptions arrivals;
  // Most requests in flight at once; 0: unbounded. A request whose arrival
  // time has come waits for a free slot; its TTFT starts when it is sent.
  int max_concurrency = 0;
  // Deadline of every Generate RPC, seconds, > 0.
  double request_timeout_s = 600;
  // Wall-clock limit of the run in seconds; 0: none. When it passes, no
  // more requests are sent and those in flight are cancelled (recorded as
  // aborted).
  double max_duration_s = 0;
  // Seeds the arrival schedule; request i samples with seed + i.
  uint64_t seed = 0;
  // SamplingParams of every request; ignore_eos makes every request
  // generate exactly its output_len tokens.
  double temperature = 0.0;
  bool ignore_eos = true;
  // Request i is named request_id_prefix + i.
  std::string request_id_prefix = "bench-";
  // When it becomes true (e.g. from a SIGINT handler) the run stops as at
  // the time limit. May be null.
  const std::atomic<bool>* interrupted = nullptr;
  // Where the progress bar goes; null: none.
  std::ostream* progress = nullptr;
};

// INVALID_ARGUMENT naming the flag when a field is out of range.
absl::Status ValidateRunnerOptions(const RunnerOptions& options);

struct RunResult {
  // One per prompt, in workload order.
  std::vector<RequestRecord> records;
  bool hit_time_limit = false;
  bool interrupted = false;
  // The run from its start to the last RPC's end, and the CPU this process
  // (every thread) used meanwhile (getrusage).
  double wall_s = 0;
  double cpu_user_s = 0;
  double cpu_system_s = 0;
};

// The request for prompt `index` of a workload.
v1::GenerateRequest MakeBenchRequest(const BenchPrompt& prompt, int index,
                                     const RunnerOptions& options);

// UNAVAILABLE naming `target` if the channel cannot connect within
// `timeout`.
absl::Status WaitForServer(grpc::Channel& channel, const std::string& target,
                           absl::Duration timeout);

// Runs the workload to the end (every RPC finished, failed or cancelled).
// Request failures are recorded, not returned; errors are only for invalid
// options.
absl::StatusOr<RunResult> RunWorkload(std::shared_ptr<grpc::Channel> channel,
                                      const std::vector<BenchPrompt>& prompts,
                                      const RunnerOptions& options);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_RUNNER_H_
