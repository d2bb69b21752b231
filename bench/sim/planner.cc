#include "bench/sim/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::sim {
namespace {

absl::StatusOr<PlanRow> Evaluate(const PlanOptions& options, int prefill,
                                 int decode, int both, double rate_scale) {
  SimOptions sim = options.base;
  sim.prefill = prefill;
  sim.decode = decode;
  sim.both = both;
  std::vector<SimRequest> requests = options.requests;
  for (SimRequest& r : requests) r.arrival_s /= rate_scale;
  absl::StatusOr<SimResult> result = Simulate(sim, requests);
  if (!result.ok()) return result.status();
  const bench::BenchMetrics m =
      bench::ComputeMetrics(result->records, options.slo, {90});
  PlanRow row;
  row.prefill = prefill;
  row.decode = decode;
  row.both = both;
  row.shape = both > 0 ? absl::StrCat(both, "C")
                       : absl::StrCat(prefill, "P", decode, "D");
  row.goodput = m.request_goodput;
  row.throughput = m.request_throughput;
  row.attainment = m.num_requests > 0
                       ? static_cast<double>(m.good_requests) / m.num_requests
                       : 0;
  if (!m.ttft_ms.percentiles.empty()) {
    row.ttft_p90_ms = m.ttft_ms.percentiles[0].second;
  }
  if (!m.tpot_ms.percentiles.empty()) {
    row.tpot_p90_ms = m.tpot_ms.percentiles[0].second;
  }
  return row;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const PlanOptions& options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError("plan: the worker budget must be >= 1");
  }
  if (options.slo.empty()) {
    return absl::InvalidArgumentError(
        "plan: give the SLOs to plan for (--goodput, e.g. 'ttft:500 "
        "tpot:50')");
  }
  if (options.requests.empty()) {
    return absl::InvalidArgumentError("plan: no requests in the workload");
  }
  Plan plan;
  for (int p = 0; p < options.workers; ++p) {
    // p == 0: every worker colocated; else p prefill, the rest decode.
    absl::StatusOr<PlanRow> row =
        p == 0 ? Evaluate(options, 0, 0, options.workers, 1.0)
               : Evaluate(options, p, options.workers - p, 0, 1.0);
    if (!row.ok()) return row.status();
    plan.rows.push_back(*row);
  }
  std::stable_sort(
      plan.rows.begin(), plan.rows.end(),
      [](const PlanRow& a, const PlanRow& b) { return a.goodput > b.goodput; });
  for (size_t i = 0; i < std::min<size_t>(2, plan.rows.size()); ++i) {
    const PlanRow best = plan.rows[i];
    for (auto [scale, out] : {std::pair{0.8, &plan.at_80_percent},
                              std::pair{1.2, &plan.at_120_percent}}) {
      absl::StatusOr<PlanRow> row =
          Evaluate(options, best.prefill, best.decode, best.both, scale);
      if (!row.ok()) return row.status();
      out->push_back(*row);
    }
  }
  return plan;
}

std::string FormatPlan(const Plan& plan, const bench::SloSpec& slo) {
  std::string out;
  if (plan.rows.empty()) return out;
  absl::StrAppendFormat(&out, "recommended: %s (goodput %.3f req/s)\n",
                        plan.rows[0].shape, plan.rows[0].goodput);
  absl::StrAppendFormat(
      &out, "SLOs:%s%s%s\n",
      slo.ttft_ms ? absl::StrFormat(" TTFT <= %.0f ms", *slo.ttft_ms) : "",
      slo.tpot_ms ? absl::StrFormat(" TPOT <= %.0f ms", *slo.tpot_ms) : "",
      slo.e2el_ms ? absl::StrFormat(" E2EL <= %.0f ms", *slo.e2el_ms) : "");
  absl::StrAppendFormat(&out, "%-8s %12s %10s %12s %12s %12s\n", "shape",
                        "goodput/s", "SLO met", "completed/s", "P90 TTFT ms",
                        "P90 TPOT ms");
  for (const PlanRow& r : plan.rows) {
    absl::StrAppendFormat(&out, "%-8s %12.3f %9.1f%% %12.3f %12.1f %12.1f\n",
                          r.shape, r.goodput, 100 * r.attainment, r.throughput,
                          r.ttft_p90_ms, r.tpot_p90_ms);
  }
  absl::StrAppend(&out,
                  "sensitivity (goodput at 0.8x / 1x / 1.2x the rate):\n");
  for (size_t i = 0; i < plan.at_80_percent.size(); ++i) {
    absl::StrAppendFormat(&out, "  %-8s %.3f / %.3f / %.3f req/s\n",
                          plan.rows[i].shape, plan.at_80_percent[i].goodput,
                          plan.rows[i].goodput, plan.at_120_percent[i].goodput);
  }
  return out;
}

}  // namespace baton::sim
