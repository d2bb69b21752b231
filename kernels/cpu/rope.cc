#include "kernels/cpu/rope.h"

#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<std::unique_ptr<RopeTable>> RopeTable::Create(
    const RopeOptions& options) {
  if (options.rope_dim <= 0 || options.rope_dim % 2 != 0 ||
      options.rope_dim > options.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: rope_dim must be even and in (0, head_dim=", options.head_dim,
        "], got ", options.rope_dim));
  }
  if (options.max_positions <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: max_positions must be > 0, got ", options.max_positions));
  }
  if (!(options.theta > 0) || !(options.linear_factor > 0)) {
    return absl::InvalidArgumentError(
        "rope: theta and linear_factor must be > 0");
  }
  const int64_t pairs = options.rope_dim / 2;
  if (!options.freq_factors.empty() &&
      static_cast<int64_t>(options.freq_factors.size()) != pairs) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: freq_factors has ", options.freq_factors.size(),
                     " values, expected rope_dim / 2 = ", pairs));
  }
  std::unique_ptr<RopeTable> table(new RopeTable(options));
  std::vector<double> inv_freq(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    inv_freq[i] = std::pow(options.theta, -2.0 * i / options.rope_dim);
    if (!options.freq_factors.empty()) inv_freq[i] /= options.freq_factors[i];
  }
  table->cos_.resize(options.max_positions * pairs);
  table->sin_.resize(options.max_positions * pairs);
  for (int64_t p = 0; p < options.max_positions; ++p) {
    double pos = p / options.linear_factor;
    for (int64_t i = 0; i < pairs; ++i) {
      double angle = pos * inv_freq[i];
      table->cos_[p * pairs + i] = static_cast<float>(std::cos(angle));
      table->sin_[p * pairs + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

void RopeTable::Apply(float* x, int64_t num_heads, int64_t position) const {
  const int64_t pairs = options_.rope_dim / 2;
  const float* c = cos_.data() + position * pairs;
  const float* s = sin_.data() + position * pairs;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* xh = x + h * options_.head_dim;
    for (int64_t i = 0; i < pairs; ++i) {
      int64_t a = options_.interleaved ? 2 * i : i;
      int64_t b = options_.interleaved ? 2 * i + 1 : i + pairs;
      float x0 = xh[a];
      float x1 = xh[b];
      xh[a] = x0 * c[i] - x1 * s[i];
      xh[b] = x0 * s[i] + x1 * c[i];
    }
  }
}

std::vector<double> Llama3FreqFactors(int64_t rope_dim, double theta,
                                      double factor, double low_freq_factor,
                                      double high_freq_factor,
                                      int64_t original_context_length) {
  const double low_freq_wavelen = original_context_length / low_freq_factor;
  const double high_freq_wavelen = original_context_length / high_freq_factor;
  std::vector<double> factors(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    double freq = std::pow(theta, -2.0 * i / rope_dim);
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) {
      factors[i] = 1.0;
    } else if (wavelen > low_freq_wavelen) {
      factors[i] = factor;
    } else {
      double smooth = (original_context_length / wavelen - low_freq_factor) /
                      (high_freq_factor - low_freq_factor);
      // new_freq = (1 - smooth) * freq / factor + smooth * freq
      factors[i] = 1.0 / ((1 - smooth) / factor + smooth);
    }
  }
  return factors;
}

}  // namespace baton
