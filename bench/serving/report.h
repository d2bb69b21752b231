// A benchmark's results for people (a text summary) and for programs (JSON
// with per-request records).
#ifndef BATON_BENCH_SERVING_REPORT_H_
#define BATON_BENCH_SERVING_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "bench/serving/metrics.h"
#include "bench/serving/runner.h"
#include "nlohmann/json.hpp"

namespace baton::bench {

// The text summary: counts, throughput, goodput (with an SLO), mean /
// median / every percentile of TTFT, TPOT, ITL and E2EL, errors by status
// code, and the benchmark client's own CPU use.
std::string FormatSummary(const BenchMetrics& metrics, const RunResult& run,
                          const SloSpec& slo);

// The JSON result: `config` (the run's settings, as the caller describes
// them) under "config", the metrics (durations in ms, a distribution as
// {"count", "mean", "median", "std", "min", "max", "p<P>"...}), "slo",
// "bench_client" (cpu use) and "requests" (one object per request, in
// workload order).
nlohmann::json ResultJson(const BenchMetrics& metrics, const RunResult& run,
                          const SloSpec& slo, const nlohmann::json& config);

// The JSON of one request record.
nlohmann::json RequestJson(const RequestRecord& record);

// CPU seconds (user + system) per wall second of the run, in percent of
// one core.
double ClientCpuPercent(const RunResult& run);

// Writes `json` (indented) to `path`, replacing it; creates no folders.
absl::Status WriteJsonFile(const nlohmann::json& json, const std::string& path);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_REPORT_H_
