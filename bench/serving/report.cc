#include "bench/serving/report.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::bench {
namespace {

using Json = nlohmann::json;

constexpr int kWidth = 52;
// Above this much of one core, the summary warns that the client itself
// may have delayed what it measured.
constexpr double kBusyClientPercent = 50;

void Rule(std::string* s, absl::string_view title, char fill = '-') {
  const int pad = kWidth - static_cast<int>(title.size());
  const int left = pad > 0 ? pad / 2 : 0;
  const int right = pad > 0 ? pad - left : 0;
  absl::StrAppend(s, std::string(left, fill), title, std::string(right, fill),
                  "\n");
}

void Row(std::string* s, absl::string_view label, absl::string_view value) {
  absl::StrAppendFormat(s, "%-38s %13s\n", label, value);
}
void Row(std::string* s, absl::string_view label, double value) {
  Row(s, label, absl::StrFormat("%.2f", value));
}

void Section(std::string* s, absl::string_view title, absl::string_view name,
             const Distribution& d) {
  Rule(s, absl::StrCat(" ", title, " "));
  Row(s, absl::StrCat("Mean ", name, " (ms):"), d.mean);
  Row(s, absl::StrCat("Median ", name, " (ms):"), d.median);
  for (const auto& [p, value] : d.percentiles) {
    Row(s, absl::StrCat("P", p, " ", name, " (ms):"), value);
  }
}

Json DistributionJson(const Distribution& d) {
  Json j = {{"count", d.count}, {"mean", d.mean}, {"median", d.median},
            {"std", d.stddev},  {"min", d.min},   {"max", d.max}};
  for (const auto& [p, value] : d.percentiles) j[absl::StrCat("p", p)] = value;
  return j;
}

Json OptionalMs(const std::optional<double>& v) {
  return v.has_value() ? Json(*v) : Json(nullptr);
}

}  // namespace

double ClientCpuPercent(const RunResult& run) {
  if (run.wall_s <= 0) return 0;
  return 100.0 * (run.cpu_user_s + run.cpu_system_s) / run.wall_s;
}

std::string FormatSummary(const BenchMetrics& m, const RunResult& run,
                          const SloSpec& slo) {
  std::string s;
  Rule(&s, " Baton serving benchmark ", '=');
  Row(&s, "Successful requests:", absl::StrCat(m.completed));
  Row(&s, "Failed requests:", absl::StrCat(m.failed));
  if (m.aborted > 0 || m.not_sent > 0) {
    Row(&s, "Cancelled at the end of the run:", absl::StrCat(m.aborted));
    Row(&s, "Never sent:", absl::StrCat(m.not_sent));
  }
  Row(&s, "Benchmark duration (s):", m.duration_s);
  Row(&s, "Total input tokens:", absl::StrCat(m.total_input_tokens));
  Row(&s, "Total generated tokens:", absl::StrCat(m.total_output_tokens));
  Row(&s, "Request throughput (req/s):", m.request_throughput);
  if (m.has_goodput) {
    Row(&s, "Requests meeting every SLO:", absl::StrCat(m.good_requests));
    Row(&s, "Request goodput (req/s):", m.request_goodput);
  }
  Row(&s, "Input token throughput (tok/s):", m.input_throughput);
  Row(&s, "Output token throughput (tok/s):", m.output_throughput);
  Row(&s, "Total token throughput (tok/s):", m.total_token_throughput);
  if (m.output_len_mismatches > 0) {
    Row(&s,
        "Output length != requested:", absl::StrCat(m.output_len_mismatches));
  }
  Section(&s, "Time to first token", "TTFT", m.ttft_ms);
  Section(&s, "Time per output token (after the 1st)", "TPOT", m.tpot_ms);
  Section(&s, "Inter-token latency", "ITL", m.itl_ms);
  Section(&s, "End-to-end latency", "E2EL", m.e2el_ms);
  if (m.has_goodput) {
    Rule(&s, " SLOs (ms) ");
    if (slo.ttft_ms) Row(&s, "TTFT <=", *slo.ttft_ms);
    if (slo.tpot_ms) Row(&s, "TPOT <=", *slo.tpot_ms);
    if (slo.e2el_ms) Row(&s, "E2EL <=", *slo.e2el_ms);
  }
  if (!m.errors_by_code.empty()) {
    Rule(&s, " Errors by status code ");
    for (const auto& [code, count] : m.errors_by_code) {
      Row(&s, absl::StrCat(code, ":"), absl::StrCat(count));
    }
  }
  if (m.refused > 0) {
    Row(&s, "Refused at admission (shed):",
        absl::StrFormat(
            "%d (%.1f%% of sent)", m.refused,
            100.0 * m.refused / std::max(1, m.num_requests - m.not_sent)));
    Section(&s, "Time to the refusal", "Refusal", m.refusal_ms);
  }
  Rule(&s, " Benchmark client ");
  Row(&s, "Client CPU (% of one core):", ClientCpuPercent(run));
  Row(&s, "Client CPU user / system (s):",
      absl::StrFormat("%.3f / %.3f", run.cpu_user_s, run.cpu_system_s));
  if (ClientCpuPercent(run) > kBusyClientPercent) {
    absl::StrAppendFormat(&s,
                          "warning: the client kept a core %.0f%% busy; its "
                          "latencies may include its own queueing\n",
                          ClientCpuPercent(run));
  }
  if (run.hit_time_limit) Row(&s, "Stopped by:", "time limit");
  if (run.interrupted) Row(&s, "Stopped by:", "interrupt");
  Rule(&s, "", '=');
  return s;
}

Json RequestJson(const RequestRecord& r) {
  Json j = {{"index", r.index},
            {"request_id", r.request_id},
            {"sent", r.sent},
            {"success", r.success},
            {"aborted", r.aborted},
            {"send_time_s", r.send_time_s},
            {"end_time_s", r.end_time_s},
            {"input_len", r.input_len},
            {"prompt_tokens", r.prompt_tokens},
            {"cached_tokens", r.cached_tokens},
            {"expected_output_len", r.expected_output_len},
            {"output_tokens", r.output_tokens},
            {"ttft_ms", r.ttft_ms},
            {"tpot_ms", OptionalMs(TpotMs(r))},
            {"e2el_ms", r.e2el_ms},
            {"itl_ms", r.itl_ms},
            {"finish_reason", r.finish_reason}};
  if (!r.success && r.sent && !r.aborted) {
    j["error_code"] = absl::StatusCodeToString(r.error_code);
    j["error_message"] = r.error_message;
  }
  if (r.success) {
    j["server"] = {
        {"queue_ms", r.server.queue_ms},
        {"prefill_ms", r.server.prefill_ms},
        {"kv_transfer_bytes", r.server.kv_transfer_bytes},
        {"kv_transfer_ms", r.server.kv_transfer_ms},
        {"kv_transfer_exposed_ms", r.server.kv_transfer_exposed_ms},
        {"ttft_ms", r.server.ttft_ms},
        {"total_ms", r.server.total_ms},
        {"reserve_kv_ms", r.server.reserve_kv_ms},
        {"reserve_kv_beside_prefill", r.server.reserve_kv_beside_prefill},
        {"prefill_worker", r.prefill_worker},
        {"decode_worker", r.decode_worker}};
  }
  return j;
}

Json ResultJson(const BenchMetrics& m, const RunResult& run, const SloSpec& slo,
                const Json& config) {
  Json j;
  j["config"] = config;
  j["num_requests"] = m.num_requests;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["aborted"] = m.aborted;
  j["not_sent"] = m.not_sent;
  j["errors_by_code"] = m.errors_by_code;
  j["refused"] = m.refused;
  j["output_len_mismatches"] = m.output_len_mismatches;
  j["hit_time_limit"] = run.hit_time_limit;
  j["interrupted"] = run.interrupted;
  j["duration_s"] = m.duration_s;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["input_throughput"] = m.input_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["slo"] = {{"ttft_ms", OptionalMs(slo.ttft_ms)},
              {"tpot_ms", OptionalMs(slo.tpot_ms)},
              {"e2el_ms", OptionalMs(slo.e2el_ms)}};
  j["good_requests"] = m.has_goodput ? Json(m.good_requests) : Json(nullptr);
  j["request_goodput"] =
      m.has_goodput ? Json(m.request_goodput) : Json(nullptr);
  j["ttft_ms"] = DistributionJson(m.ttft_ms);
  j["tpot_ms"] = DistributionJson(m.tpot_ms);
  j["itl_ms"] = DistributionJson(m.itl_ms);
  j["e2el_ms"] = DistributionJson(m.e2el_ms);
  j["refusal_ms"] = DistributionJson(m.refusal_ms);
  j["bench_client"] = {{"wall_s", run.wall_s},
                       {"cpu_user_s", run.cpu_user_s},
                       {"cpu_system_s", run.cpu_system_s},
                       {"cpu_percent_of_one_core", ClientCpuPercent(run)}};
  Json requests = Json::array();
  for (const RequestRecord& r : run.records) requests.push_back(RequestJson(r));
  j["requests"] = std::move(requests);
  return j;
}

absl::Status WriteJsonFile(const Json& json, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write the result file '", path, "'"));
  }
  out << json.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  out.close();
  if (!out) {
    return absl::DataLossError(
        absl::StrCat("writing the result file '", path, "' failed"));
  }
  return absl::OkStatus();
}

}  // namespace baton::bench
