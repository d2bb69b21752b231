#include "bench/sim/fit.h"

#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace baton::sim {
namespace {

double Predict(const CostModel& m, const Sample& s) {
  return m.c0 + m.c1 * s.x1 + m.c2 * s.x2;
}

// Least squares over the columns in `active` (bit k: coefficient k free;
// the others are 0), by the normal equations; false if they are singular.
bool Solve(const std::vector<Sample>& samples, unsigned active,
           CostModel* out) {
  std::array<int, 3> cols{};
  int n = 0;
  for (int k = 0; k < 3; ++k) {
    if (active & (1u << k)) cols[n++] = k;
  }
  auto x = [](const Sample& s, int k) {
    return k == 0 ? 1.0 : k == 1 ? s.x1 : s.x2;
  };
  // Each row is scaled by 1 / y, so the fit minimises relative errors.
  double a[3][4] = {};
  for (const Sample& s : samples) {
    const double w = 1.0 / (s.y * s.y);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) a[i][j] += w * x(s, cols[i]) * x(s, cols[j]);
      a[i][n] += w * x(s, cols[i]) * s.y;
    }
  }
  for (int i = 0; i < n; ++i) {  // Gaussian elimination, partial pivoting
    int pivot = i;
    for (int r = i + 1; r < n; ++r) {
      if (std::abs(a[r][i]) > std::abs(a[pivot][i])) pivot = r;
    }
    if (!(std::abs(a[pivot][i]) > 1e-300)) return false;
    for (int c = 0; c <= n; ++c) std::swap(a[i][c], a[pivot][c]);
    for (int r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = a[r][i] / a[i][i];
      for (int c = i; c <= n; ++c) a[r][c] -= f * a[i][c];
    }
  }
  double c[3] = {0, 0, 0};
  for (int i = 0; i < n; ++i) c[cols[i]] = a[i][n] / a[i][i];
  *out = CostModel{c[0], c[1], c[2]};
  return true;
}

// The non-negative model with the least squared relative error.
CostModel FitNonNegative(const std::vector<Sample>& samples) {
  CostModel best;
  double best_error = std::numeric_limits<double>::infinity();
  for (unsigned active = 1; active < 8; ++active) {
    CostModel m;
    if (!Solve(samples, active, &m)) continue;
    if (m.c0 < 0 || m.c1 < 0 || m.c2 < 0) continue;
    double error = 0;
    for (const Sample& s : samples) {
      const double r = (Predict(m, s) - s.y) / s.y;
      error += r * r;
    }
    if (error < best_error) {
      best_error = error;
      best = m;
    }
  }
  return best;
}

}  // namespace

double Mape(const CostModel& model, const std::vector<Sample>& samples) {
  if (samples.empty()) return 0;
  double sum = 0;
  for (const Sample& s : samples) {
    sum += std::abs(Predict(model, s) - s.y) / s.y;
  }
  return sum / static_cast<double>(samples.size());
}

absl::StatusOr<FitResult> FitCostModel(const std::vector<Sample>& samples,
                                       const std::string& what,
                                       double max_heldout_mape) {
  if (samples.size() < 6) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d samples; a fit needs at least 6 (half are held out)", what,
        samples.size()));
  }
  for (const Sample& s : samples) {
    if (!(s.y > 0) || !std::isfinite(s.x1) || !std::isfinite(s.x2)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: a sample with time %g (x1 %g, x2 %g); times must be > 0", what,
          s.y, s.x1, s.x2));
    }
  }
  std::vector<Sample> train, heldout;
  for (size_t i = 0; i < samples.size(); ++i) {
    (i % 2 == 0 ? train : heldout).push_back(samples[i]);
  }
  FitResult result;
  result.samples = samples.size();
  result.heldout_mape = Mape(FitNonNegative(train), heldout);
  result.model = FitNonNegative(samples);
  result.mape = Mape(result.model, samples);
  if (result.heldout_mape > max_heldout_mape) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the fitted model is off by %.1f%% on held-out samples (limit "
        "%.1f%%): c0 %g, c1 %g, c2 %g does not describe these times",
        what, 100 * result.heldout_mape, 100 * max_heldout_mape,
        result.model.c0, result.model.c1, result.model.c2));
  }
  return result;
}

}  // namespace baton::sim
