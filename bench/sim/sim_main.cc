// `baton-sim`: simulates a Baton cluster with the coordinator's own
// admission and routing code and a worker cost profile (simulator.h), and
// prints what baton-bench would: TTFT / TPOT / ITL / E2EL percentiles,
// throughput, goodput and SLO attainment, in the same JSON shape.
//
//   baton-sim --profile=FILE --shape=1P1D [--policy=least_loaded]
//             [--num_prompts=N --request_rate=R --burstiness=B
//              --random_input_len=N --random_output_len=N
//              --random_range_ratio=X | --trace=CSV]
//             [--prefix_cache=true|false --trace_piece_tokens=512]
//             [--local_prefill_tokens=N]
//             [--ttft_slo_ms=N] [--max_waiting_requests=N]
//             [--goodput="ttft:MS tpot:MS"] [--metric_percentiles=50,90,99]
//             [--seed=N] [--save_result --result_filename=FILE]
//
// Trace formats: bench/sim/workload.h.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/serving/metrics.h"
#include "bench/serving/report.h"
#include "bench/sim/simulator.h"
#include "bench/sim/workload.h"

ABSL_FLAG(std::string, profile, "", "worker cost profile (JSON; profile.h)");
ABSL_FLAG(std::string, shape, "1P1D", "workers by role, e.g. 1P1D, 2C, 4P12D");
ABSL_FLAG(std::string, policy, "least_loaded", "least_loaded or round_robin");
ABSL_FLAG(int32_t, num_prompts, 1000, "requests (without --trace)");
ABSL_FLAG(double, request_rate, 1.0, "mean requests per second");
ABSL_FLAG(double, burstiness, 1.0,
          "gamma shape of the gaps: 1 Poisson, < 1 burstier");
ABSL_FLAG(int32_t, random_input_len, 1024, "mean prompt tokens");
ABSL_FLAG(int32_t, random_output_len, 128, "mean output tokens");
ABSL_FLAG(double, random_range_ratio, 0.0,
          "lengths uniform in [mean (1 - r), mean (1 + r)]");
ABSL_FLAG(std::string, trace, "", "CSV trace of arrivals and lengths");
ABSL_FLAG(bool, prefix_cache, true,
          "workers cache prompt blocks by prefix (traces with hash ids)");
ABSL_FLAG(int64_t, local_prefill_tokens, 0,
          "the coordinator's --local_prefill_tokens (0: always split)");
ABSL_FLAG(int64_t, trace_piece_tokens, 512,
          "tokens per hash id of a trace (Mooncake's: 512)");
ABSL_FLAG(int64_t, ttft_slo_ms, 0, "the coordinator's --ttft_slo_ms");
ABSL_FLAG(int64_t, max_waiting_requests, 1024,
          "the coordinator's --max_waiting_requests");
ABSL_FLAG(std::string, goodput, "",
          "SLOs for goodput, e.g. 'ttft:500 tpot:50'");
ABSL_FLAG(std::string, metric_percentiles, "50,90,99", "percentiles to print");
ABSL_FLAG(int32_t, workers_per_host, 1,
          "workers that share one host (in the order prefill, decode, "
          "colocated); they slow each other's steps by the profile's "
          "neighbor_slowdown");
ABSL_FLAG(int64_t, seed, 0, "seeds the arrivals and lengths");
ABSL_FLAG(bool, save_result, false, "write the JSON result");
ABSL_FLAG(std::string, result_filename, "baton-sim.json", "where");

namespace baton::sim {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "baton-sim: %s\n",
               std::string(status.message()).c_str());
  return 2;
}

int Main() {
  SimOptions options;
  if (absl::Status s = ParseShape(absl::GetFlag(FLAGS_shape), &options);
      !s.ok()) {
    return Fail(s);
  }
  if (absl::GetFlag(FLAGS_profile).empty()) {
    return Fail(absl::InvalidArgumentError("--profile is required"));
  }
  auto profile = LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return Fail(profile.status());
  options.profile = *profile;
  options.policy = absl::GetFlag(FLAGS_policy);
  options.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.local_prefill_tokens = absl::GetFlag(FLAGS_local_prefill_tokens);
  options.piece_tokens = absl::GetFlag(FLAGS_trace_piece_tokens);
  options.workers_per_host = absl::GetFlag(FLAGS_workers_per_host);
  options.admission.ttft_slo =
      absl::Milliseconds(absl::GetFlag(FLAGS_ttft_slo_ms));
  options.admission.max_waiting_requests =
      absl::GetFlag(FLAGS_max_waiting_requests);
  auto slo = bench::ParseSlo(absl::GetFlag(FLAGS_goodput));
  if (!slo.ok()) return Fail(slo.status());
  auto percentiles =
      bench::ParsePercentiles(absl::GetFlag(FLAGS_metric_percentiles));
  if (!percentiles.ok()) return Fail(percentiles.status());
  WorkloadOptions workload;
  workload.trace = absl::GetFlag(FLAGS_trace);
  workload.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  workload.request_rate = absl::GetFlag(FLAGS_request_rate);
  workload.burstiness = absl::GetFlag(FLAGS_burstiness);
  workload.input_len = absl::GetFlag(FLAGS_random_input_len);
  workload.output_len = absl::GetFlag(FLAGS_random_output_len);
  workload.range_ratio = absl::GetFlag(FLAGS_random_range_ratio);
  workload.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  auto requests = MakeWorkload(workload);
  if (!requests.ok()) return Fail(requests.status());

  const auto start = std::chrono::steady_clock::now();
  auto result = Simulate(options, *requests);
  if (!result.ok()) return Fail(result.status());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);

  bench::RunResult run;
  run.wall_s = result->end_s;
  run.records = std::move(result->records);
  const bench::BenchMetrics metrics =
      bench::ComputeMetrics(run.records, *slo, *percentiles);
  std::printf("%s", bench::FormatSummary(metrics, run, *slo).c_str());
  if (result->cached_tokens > 0) {
    std::printf(
        "prefix cache: %lld of %lld prompt tokens cached (%.1f%%), %lld "
        "blocks evicted\n",
        static_cast<long long>(result->cached_tokens),
        static_cast<long long>(result->prompt_tokens),
        100.0 * static_cast<double>(result->cached_tokens) /
            static_cast<double>(result->prompt_tokens),
        static_cast<long long>(result->evicted_blocks));
  }
  std::printf(
      "simulated %zu requests on %s (%s) in %.2f s of wall time, %lld "
      "events, max RSS %.0f MiB\n",
      requests->size(), absl::GetFlag(FLAGS_shape).c_str(),
      options.profile.name.c_str(), took,
      static_cast<long long>(result->events), usage.ru_maxrss / 1024.0);
  if (absl::GetFlag(FLAGS_save_result)) {
    nlohmann::json config = {
        {"simulated", true},
        {"shape", absl::GetFlag(FLAGS_shape)},
        {"policy", options.policy},
        {"profile", ProfileJson(options.profile)},
        {"ttft_slo_ms", absl::GetFlag(FLAGS_ttft_slo_ms)},
        {"trace", absl::GetFlag(FLAGS_trace)},
        {"prefix_cache", options.prefix_cache},
        {"local_prefill_tokens", options.local_prefill_tokens},
        {"cached_tokens", result->cached_tokens},
        {"prompt_tokens", result->prompt_tokens},
        {"request_rate", absl::GetFlag(FLAGS_request_rate)},
        {"seed", absl::GetFlag(FLAGS_seed)}};
    if (absl::Status s =
            bench::WriteJsonFile(bench::ResultJson(metrics, run, *slo, config),
                                 absl::GetFlag(FLAGS_result_filename));
        !s.ok()) {
      return Fail(s);
    }
  }
  return 0;
}

}  // namespace
}  // namespace baton::sim

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "baton-sim --profile=FILE --shape=1P1D [--request_rate=R ...]");
  absl::ParseCommandLine(argc, argv);
  return baton::sim::Main();
}
