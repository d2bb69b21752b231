// What one request measured, and the benchmark's summary statistics over
// all of them. Definitions (those of `vllm bench serve`):
//   TTFT  send -> first message carrying a token.
//   E2EL  send -> final message (the one with the result).
//   TPOT  per request, (E2EL - TTFT) / (output_tokens - 1); requests with one
//         output token have none.
//   ITL   the gaps between successive messages carrying tokens: a message
//         with k tokens is one arrival (one gap), not k.
//   Throughput divides by the benchmark duration: first send -> last end.
//   Goodput counts completed requests that meet every SLO given (DistServe).
#ifndef BATON_BENCH_SERVING_METRICS_H_
#define BATON_BENCH_SERVING_METRICS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::bench {

// Where the server says the time of one request went (GenerateResult's
// PhaseTimings); all 0 when no result arrived.
struct ServerTimings {
  double queue_ms = 0;
  double prefill_ms = 0;
  int64_t kv_transfer_bytes = 0;
  double kv_transfer_ms = 0;
  double kv_transfer_exposed_ms = 0;
  double ttft_ms = 0;
  double total_ms = 0;
  double reserve_kv_ms = 0;  // part of queue_ms (split serving)...
  bool reserve_kv_beside_prefill = false;  // ... unless made beside it
};

struct RequestRecord {
  int index = 0;  // in the workload
  std::string request_id;
  // False: the run ended (time limit, interrupt) before its turn came.
  bool sent = false;
  // Cancelled by the benchmark itself (time limit, interrupt) while in
  // flight: neither a success nor a failure.
  bool aborted = false;
  bool success = false;
  // Failures only: the RPC status, or the in-band error_code of a result
  // with FINISH_REASON_ERROR (or CANCELLED); INTERNAL for a stream that
  // ended without a result.
  absl::StatusCode error_code = absl::StatusCode::kOk;
  std::string error_message;
  std::string finish_reason;  // "stop", "length", "cancelled", "error", ""
  // Seconds from the benchmark's start to the send and to the end of the
  // RPC (success or not).
  double send_time_s = 0;
  double end_time_s = 0;
  int input_len = 0;            // the dataset's count
  int prompt_tokens = 0;        // usage.prompt_tokens, else input_len
  int cached_tokens = 0;        // of them, found in a prefix cache
  int expected_output_len = 0;  // max_tokens asked for
  int output_tokens = 0;        // tokens received
  double ttft_ms = 0;           // 0 when no token arrived
  double e2el_ms = 0;
  std::vector<double> itl_ms;
  ServerTimings server;
  std::string prefill_worker;
  std::string decode_worker;
};

// (E2EL - TTFT) / (output_tokens - 1), or nullopt with < 2 output tokens.
std::optional<double> TpotMs(const RequestRecord& record);

// Service-level objectives in milliseconds; unset ones are not checked.
struct SloSpec {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};

// Parses "ttft:500 tpot:50", "ttft:500,e2el:2000" (entries separated by
// spaces or commas, metrics ttft / tpot / e2el, values finite and > 0 ms).
// INVALID_ARGUMENT naming the entry for an unknown metric, a bad number or
// a metric given twice.
absl::StatusOr<SloSpec> ParseSlo(absl::string_view spec);

// A successful request whose TTFT, TPOT and E2EL are each <= its SLO.
bool MeetsSlo(const RequestRecord& record, const SloSpec& slo);

// Parses "50,90,99.9": each in (0, 100], ascending after sorting, no
// duplicates kept.
absl::StatusOr<std::vector<double>> ParsePercentiles(absl::string_view list);

struct Distribution {
  size_t count = 0;
  double mean = 0;
  double median = 0;
  double stddev = 0;  // population
  double min = 0;
  double max = 0;
  // (percentile, value), linear interpolation between closest ranks.
  std::vector<std::pair<double, double>> percentiles;
};

// Statistics of `values` (all 0 when empty).
Distribution Summarize(std::vector<double> values,
                       const std::vector<double>& percentiles);

struct BenchMetrics {
  int num_requests = 0;
  int completed = 0;
  int failed = 0;
  int aborted = 0;   // cancelled in flight by the benchmark
  int not_sent = 0;  // never sent (time limit, interrupt)
  // Failures by canonical status code name, e.g. {"UNAVAILABLE", 3}.
  std::map<std::string, int> errors_by_code;
  // Of the failures: refused with RESOURCE_EXHAUSTED before any token (the
  // server shed them at admission), and how long each refusal took from
  // the send.
  int refused = 0;
  Distribution refusal_ms;
  // Completed requests whose output_tokens != expected_output_len.
  int output_len_mismatches = 0;
  int64_t total_input_tokens = 0;   // of completed requests
  int64_t total_output_tokens = 0;  // of completed requests
  double duration_s = 0;
  double request_throughput = 0;  // completed / s
  double input_throughput = 0;    // tokens / s
  double output_throughput = 0;
  double total_token_throughput = 0;
  bool has_goodput = false;  // an SLO was given
  int good_requests = 0;
  double request_goodput = 0;  // good_requests / s
  Distribution ttft_ms;
  Distribution tpot_ms;
  Distribution itl_ms;
  Distribution e2el_ms;
};

// Latency statistics over completed requests; the duration runs from the
// first send to the last end of any sent request.
BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records,
                            const SloSpec& slo,
                            const std::vector<double>& percentiles);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_METRICS_H_
