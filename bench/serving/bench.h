// baton-bench as a library: validate the options, connect, build the
// workload, run it, print the summary and save the JSON. A sweep calls
// RunBench once per point (or the lower layers: dataset.h, runner.h,
// metrics.h, report.h).
#ifndef BATON_BENCH_SERVING_BENCH_H_
#define BATON_BENCH_SERVING_BENCH_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "bench/serving/dataset.h"
#include "bench/serving/metrics.h"
#include "bench/serving/multiturn.h"
#include "bench/serving/runner.h"
#include "common/auth/bearer_interceptor.h"
#include "nlohmann/json.hpp"

namespace baton::bench {

struct BenchOptions {
  // --- what to load ---
  // host:port of a baton-coordinator (or any baton.v1.Baton server).
  // Required.
  std::string server;
  // TLS and API key (plaintext, no key by default).
  ClientSecurity security;
  // "random", "sharegpt" or "multiturn".
  std::string dataset_name = "random";
  // multiturn: the conversations (output_len, vocabulary, concurrency,
  // seed, model and timeout are taken from `random` and `runner`).
  MultiTurnOptions multiturn;
  // random: every field; sharegpt: num_prompts is taken from here too.
  RandomDatasetOptions random;
  // sharegpt: path, output_len and the length bounds.
  ShareGptOptions sharegpt;
  // Model, arrivals, concurrency, limits, seed, sampling. runner.model
  // empty: the only model the server lists.
  RunnerOptions runner;
  // --- what to report ---
  // SLOs for goodput, e.g. "ttft:500 tpot:50" (metrics.h ParseSlo); empty:
  // no goodput.
  std::string goodput;
  // Percentiles reported besides the median, p90 and p99, e.g. "95,99.9".
  std::string metric_percentiles;
  bool save_result = false;
  // Folder of the JSON result; must exist.
  std::string result_dir = ".";
  // Empty: "baton-bench-DATASET-RATEqps-cCONCURRENCY-YYYYMMDD-HHMMSS.json".
  std::string result_filename;
  // --- client ---
  // How long to wait for the server to accept a connection, seconds.
  double connect_timeout_s = 10;
  // CPUs for this process's threads started from now on (including gRPC's
  // when it starts here), e.g. "3" or "2-3,6"; empty: no pinning.
  std::string cpus;
  // Ask the cluster to drop every cached prefix before the run
  // (Baton.ResetPrefixCache; an admin call, behind the API key when keys are
  // configured), so a run that resends an earlier run's prompts measures
  // them cold.
  bool reset_prefix_cache = false;
};

struct BenchOutcome {
  BenchMetrics metrics;
  RunResult run;
  // The saved JSON file; empty when not saved.
  std::string result_path;
  // The config object of the JSON result.
  nlohmann::json config;
};

// INVALID_ARGUMENT naming the flag for any option out of range (no network
// access).
absl::Status ValidateBenchOptions(const BenchOptions& options);

// The whole benchmark. The summary goes to `out`, notes (dataset counts,
// where the result was saved) to `err`. Returns an error, before any
// request is sent, for invalid options (INVALID_ARGUMENT), a missing dataset
// file (NOT_FOUND), an unreachable server (UNAVAILABLE) or an unknown model
// (NOT_FOUND); request failures are in the outcome, and the JSON is saved
// (when asked) whatever they were.
absl::StatusOr<BenchOutcome> RunBench(const BenchOptions& options,
                                      std::ostream& out, std::ostream& err);

// Empty if every request completed; otherwise one line saying what went
// wrong, e.g. "3 of 8 requests failed (UNAVAILABLE: 3)".
std::string OutcomeProblem(const BenchOutcome& outcome);

// The process exit status: 0 every request completed; 1 none did; 3 some
// failed, were cancelled at the time limit or never sent.
int OutcomeExitCode(const BenchOutcome& outcome);

// Pins the calling thread (and threads it starts later) to `cpus`, a list
// like "0,2-3". INVALID_ARGUMENT for a malformed list, the OS error
// otherwise.
absl::Status PinToCpus(const std::string& cpus);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_BENCH_H_
