#include "bench/serving/arrivals.h"

#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton::bench {
namespace {

// Keeps the arrival stream apart from the prompt stream of the same seed.
constexpr uint64_t kArrivalStream = 0x6172726976616c73ull;

}  // namespace

absl::Status ValidateArrivalOptions(const ArrivalOptions& options) {
  const double rate = options.request_rate;
  if (std::isnan(rate) || rate <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--request-rate must be > 0 requests/s or inf, got ", rate));
  }
  if (!std::isfinite(options.burstiness) || options.burstiness <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--burstiness must be a finite number > 0, got ", options.burstiness));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ArrivalOffsets(
    int num_requests, const ArrivalOptions& options, uint64_t seed) {
  if (num_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_requests must be >= 0, got ", num_requests));
  }
  BATON_RETURN_IF_ERROR(ValidateArrivalOptions(options));
  std::vector<double> offsets(num_requests, 0.0);
  if (std::isinf(options.request_rate)) return offsets;
  // Gamma(shape k, scale theta) has mean k * theta; theta = 1 / (rate * k)
  // keeps the mean gap at 1 / rate.
  const double shape = options.burstiness;
  const double scale = 1.0 / (options.request_rate * shape);
  std::mt19937_64 rng(seed ^ kArrivalStream);
  std::gamma_distribution<double> gap(shape, scale);
  double t = 0;
  for (int i = 0; i < num_requests; ++i) {
    t += gap(rng);
    offsets[i] = t;
  }
  return offsets;
}

}  // namespace baton::bench
