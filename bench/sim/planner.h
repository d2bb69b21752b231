// `baton-bench plan`: which split of a worker budget serves a workload best.
// Every shape of N workers — N colocated (NC) and every kP(N-k)D — is
// simulated (simulator.h) on the same arrivals, and ranked by goodput (the
// requests per second that meet every SLO, DistServe's measure); the best
// two are simulated again at 0.8x and 1.2x the arrival rate, so a user sees
// how much the pick depends on the load being what they said.
#ifndef BATON_BENCH_SIM_PLANNER_H_
#define BATON_BENCH_SIM_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/metrics.h"
#include "bench/sim/simulator.h"

namespace baton::sim {

struct PlanOptions {
  int workers = 2;  // the budget, >= 1
  // Profile, policy and admission of every simulated shape.
  SimOptions base;
  std::vector<SimRequest> requests;
  bench::SloSpec slo;  // at least one SLO
};

struct PlanRow {
  std::string shape;                      // "2C", "1P1D", ...
  int prefill = 0, decode = 0, both = 0;  // the same, as counts
  double goodput = 0;                     // requests/s meeting every SLO
  double attainment = 0;  // of the requests, the fraction that did
  double throughput = 0;  // completed requests/s
  double ttft_p90_ms = 0;
  double tpot_p90_ms = 0;
};

struct Plan {
  // Every shape, best goodput first (ties: fewer prefill workers first).
  std::vector<PlanRow> rows;
  // The best two shapes at 0.8x and 1.2x the arrival rate.
  std::vector<PlanRow> at_80_percent;
  std::vector<PlanRow> at_120_percent;
};

// INVALID_ARGUMENT for a budget < 1, no SLO or no requests.
absl::StatusOr<Plan> MakePlan(const PlanOptions& options);

// The table a user reads, with the recommendation first.
std::string FormatPlan(const Plan& plan, const bench::SloSpec& slo);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_PLANNER_H_
