#include "bench/serving/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton::bench {
namespace {

// Linear interpolation between the closest ranks of sorted `v` (numpy's
// default percentile).
double Percentile(const std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

}  // namespace

std::optional<double> TpotMs(const RequestRecord& record) {
  if (record.output_tokens < 2) return std::nullopt;
  return (record.e2el_ms - record.ttft_ms) / (record.output_tokens - 1);
}

absl::StatusOr<SloSpec> ParseSlo(absl::string_view spec) {
  SloSpec slo;
  for (absl::string_view entry :
       absl::StrSplit(spec, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    double ms = 0;
    if (!absl::SimpleAtod(kv.second, &ms) || !std::isfinite(ms) || ms <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--goodput: '", entry, "' must be METRIC:MS with MS a number > 0"));
    }
    std::optional<double>* target = nullptr;
    if (kv.first == "ttft") target = &slo.ttft_ms;
    if (kv.first == "tpot") target = &slo.tpot_ms;
    if (kv.first == "e2el") target = &slo.e2el_ms;
    if (target == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: unknown metric '", kv.first, "' in '", entry,
                       "'; known: ttft, tpot, e2el"));
    }
    if (target->has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: metric '", kv.first, "' given twice"));
    }
    *target = ms;
  }
  return slo;
}

bool MeetsSlo(const RequestRecord& record, const SloSpec& slo) {
  if (!record.success) return false;
  if (slo.ttft_ms && record.ttft_ms > *slo.ttft_ms) return false;
  if (slo.e2el_ms && record.e2el_ms > *slo.e2el_ms) return false;
  const std::optional<double> tpot = TpotMs(record);
  if (slo.tpot_ms && tpot && *tpot > *slo.tpot_ms) return false;
  return true;
}

absl::StatusOr<std::vector<double>> ParsePercentiles(absl::string_view list) {
  std::vector<double> out;
  for (absl::string_view entry :
       absl::StrSplit(list, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    double p = 0;
    if (!absl::SimpleAtod(entry, &p) || !(p > 0 && p <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metric-percentiles: '", entry, "' is not a number in (0, 100]"));
    }
    out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Distribution Summarize(std::vector<double> values,
                       const std::vector<double>& percentiles) {
  Distribution d;
  d.count = values.size();
  for (double p : percentiles) d.percentiles.emplace_back(p, 0.0);
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / values.size();
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(sq / values.size());
  d.min = values.front();
  d.max = values.back();
  d.median = Percentile(values, 50);
  for (auto& [p, value] : d.percentiles) value = Percentile(values, p);
  return d;
}

BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records,
                            const SloSpec& slo,
                            const std::vector<double>& percentiles) {
  BenchMetrics m;
  m.num_requests = static_cast<int>(records.size());
  m.has_goodput = !slo.empty();
  std::vector<double> ttft, tpot, itl, e2el, refusal;
  double first_send = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  for (const RequestRecord& r : records) {
    if (!r.sent) {
      ++m.not_sent;
      continue;
    }
    first_send = std::min(first_send, r.send_time_s);
    last_end = std::max(last_end, r.end_time_s);
    if (r.aborted) {
      ++m.aborted;
      continue;
    }
    if (!r.success) {
      ++m.failed;
      ++m.errors_by_code[absl::StatusCodeToString(r.error_code)];
      if (r.error_code == absl::StatusCode::kResourceExhausted &&
          r.output_tokens == 0) {
        ++m.refused;
        refusal.push_back(1e3 * (r.end_time_s - r.send_time_s));
      }
      continue;
    }
    ++m.completed;
    if (r.output_tokens != r.expected_output_len) ++m.output_len_mismatches;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2el.push_back(r.e2el_ms);
    if (const std::optional<double> t = TpotMs(r)) tpot.push_back(*t);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    if (m.has_goodput && MeetsSlo(r, slo)) ++m.good_requests;
  }
  if (last_end > first_send) m.duration_s = last_end - first_send;
  if (m.duration_s > 0) {
    m.request_throughput = m.completed / m.duration_s;
    m.input_throughput = m.total_input_tokens / m.duration_s;
    m.output_throughput = m.total_output_tokens / m.duration_s;
    m.total_token_throughput =
        (m.total_input_tokens + m.total_output_tokens) / m.duration_s;
    m.request_goodput = m.good_requests / m.duration_s;
  }
  m.ttft_ms = Summarize(std::move(ttft), percentiles);
  m.tpot_ms = Summarize(std::move(tpot), percentiles);
  m.itl_ms = Summarize(std::move(itl), percentiles);
  m.e2el_ms = Summarize(std::move(e2el), percentiles);
  m.refusal_ms = Summarize(std::move(refusal), percentiles);
  return m;
}

}  // namespace baton::bench
