// Fitting a cost model to measurements: y = c0 + c1·x1 + c2·x2 by least
// squares with every coefficient >= 0 (the best of the eight active sets,
// so the model never decreases in its arguments), validated on held-out
// points: the fit is made on every other sample and its mean absolute
// percentage error (MAPE) measured on the rest, then refitted on all.
#ifndef BATON_BENCH_SIM_FIT_H_
#define BATON_BENCH_SIM_FIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/cost_profile.h"

namespace baton::sim {

struct Sample {
  double x1 = 0;
  double x2 = 0;
  double y = 0;  // > 0
};

struct FitResult {
  CostModel model;
  // Mean absolute percentage error (0.05 = 5%) of the model fitted on the
  // even-indexed samples, on the odd-indexed ones; and of the final model
  // on every sample.
  double heldout_mape = 0;
  double mape = 0;
  size_t samples = 0;
};

// INVALID_ARGUMENT naming `what` with fewer than 6 samples or a y <= 0;
// FAILED_PRECONDITION naming `what`, the held-out MAPE and the limit when
// it is above `max_heldout_mape` (the model does not describe the data).
absl::StatusOr<FitResult> FitCostModel(const std::vector<Sample>& samples,
                                       const std::string& what,
                                       double max_heldout_mape = 0.10);

// The mean absolute percentage error of `model` on `samples`.
double Mape(const CostModel& model, const std::vector<Sample>& samples);

}  // namespace baton::sim

#endif  // BATON_BENCH_SIM_FIT_H_
