// `baton-sim`: simulates a Baton cluster with the coordinator's own
// admission and routing code and a worker cost profile (simulator.h), and
// prints what baton-bench would: TTFT / TPOT / ITL / E2EL percentiles,
// throughput, goodput and SLO attainment, in the same JSON shape.
//
//   baton-sim --profile=FILE --shape=1P1D [--policy=least_loaded]
//             [--num_prompts=N --request_rate=R --burstiness=B
//              --random_input_len=N --random_output_len=N
//              --random_range_ratio=X | --trace=CSV]
//             [--ttft_slo_ms=N] [--max_waiting_requests=N]
//             [--goodput="ttft:MS tpot:MS"] [--metric_percentiles=50,90,99]
//             [--seed=N] [--save_result --result_filename=FILE]
//
// A trace is a CSV file with a header: either `timestamp_s,input_len,
// output_len` (seconds from the start), or Azure's LLM inference trace
// columns `TIMESTAMP,ContextTokens,GeneratedTokens` (TIMESTAMP as
// "2023-11-16 18:15:46.6805900"; times are taken relative to the first).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/serving/arrivals.h"
#include "bench/serving/metrics.h"
#include "bench/serving/report.h"
#include "bench/sim/simulator.h"

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
ABSL_FLAG(int64_t, ttft_slo_ms, 0, "the coordinator's --ttft_slo_ms");
ABSL_FLAG(int64_t, max_waiting_requests, 1024,
          "the coordinator's --max_waiting_requests");
ABSL_FLAG(std::string, goodput, "",
          "SLOs for goodput, e.g. 'ttft:500 tpot:50'");
ABSL_FLAG(std::string, metric_percentiles, "50,90,99", "percentiles to print");
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

absl::StatusOr<std::vector<SimRequest>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string line;
  std::getline(in, line);
  const bool azure = line.rfind("TIMESTAMP", 0) == 0;
  if (!azure && line.rfind("timestamp_s", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": header must be timestamp_s,input_len,output_len or "
                     "TIMESTAMP,ContextTokens,GeneratedTokens"));
  }
  std::vector<SimRequest> out;
  absl::Time first = absl::InfinitePast();
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    SimRequest r;
    bool ok = f.size() == 3 && absl::SimpleAtoi(f[1], &r.input_len) &&
              absl::SimpleAtoi(f[2], &r.output_len);
    if (ok && azure) {
      absl::Time t;
      std::string error;
      ok = absl::ParseTime("%Y-%m-%d %H:%M:%E*S", f[0], &t, &error);
      if (first == absl::InfinitePast()) first = t;
      r.arrival_s = absl::ToDoubleSeconds(t - first);
    } else if (ok) {
      ok = absl::SimpleAtod(f[0], &r.arrival_s);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", row, ": cannot read '", line, "'"));
    }
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SimRequest& a, const SimRequest& b) {
                     return a.arrival_s < b.arrival_s;
                   });
  return out;
}

absl::StatusOr<std::vector<SimRequest>> Workload() {
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    return ReadTrace(absl::GetFlag(FLAGS_trace));
  }
  bench::ArrivalOptions arrivals;
  arrivals.request_rate = absl::GetFlag(FLAGS_request_rate);
  arrivals.burstiness = absl::GetFlag(FLAGS_burstiness);
  const uint64_t seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  auto offsets =
      bench::ArrivalOffsets(absl::GetFlag(FLAGS_num_prompts), arrivals, seed);
  if (!offsets.ok()) return offsets.status();
  const double ratio = absl::GetFlag(FLAGS_random_range_ratio);
  if (!(ratio >= 0 && ratio < 1)) {
    return absl::InvalidArgumentError("--random_range_ratio: in [0, 1)");
  }
  std::mt19937_64 rng(seed ^ 0x5eedULL);
  auto length = [&](int32_t mean) {
    const auto lo = std::max<int64_t>(1, std::llround(mean * (1 - ratio)));
    const auto hi = std::max<int64_t>(lo, std::llround(mean * (1 + ratio)));
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<SimRequest> out;
  for (double t : *offsets) {
    SimRequest r;
    r.arrival_s = t;
    r.input_len = length(absl::GetFlag(FLAGS_random_input_len));
    r.output_len = length(absl::GetFlag(FLAGS_random_output_len));
    out.push_back(r);
  }
  return out;
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
  options.admission.ttft_slo =
      absl::Milliseconds(absl::GetFlag(FLAGS_ttft_slo_ms));
  options.admission.max_waiting_requests =
      absl::GetFlag(FLAGS_max_waiting_requests);
  auto slo = bench::ParseSlo(absl::GetFlag(FLAGS_goodput));
  if (!slo.ok()) return Fail(slo.status());
  auto percentiles =
      bench::ParsePercentiles(absl::GetFlag(FLAGS_metric_percentiles));
  if (!percentiles.ok()) return Fail(percentiles.status());
  auto requests = Workload();
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
  const bench::BenchMetrics metrics =
      bench::ComputeMetrics(result->records, *slo, *percentiles);
  std::printf("%s", bench::FormatSummary(metrics, run, *slo).c_str());
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
