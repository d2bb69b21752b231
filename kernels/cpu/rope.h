// Rotary position embeddings with a precomputed cos/sin table.
#ifndef BATON_KERNELS_CPU_ROPE_H_
#define BATON_KERNELS_CPU_ROPE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

struct RopeOptions {
  int64_t head_dim = 0;    // elements per head
  int64_t rope_dim = 0;    // leading dims rotated (even, <= head_dim)
  double theta = 10000.0;  // frequency base
  // Adjacent pairs (x[2i], x[2i+1]) when true, halves (x[i], x[i + d/2])
  // when false; d = rope_dim.
  bool interleaved = true;
  int64_t max_positions = 0;  // table size; positions must be below it
  // Linear position scaling (positions divided by this), 1 = none.
  double linear_factor = 1.0;
  // Per-pair frequency divisors (Llama 3.1 rope_freqs / llama3 scaling),
  // rope_dim / 2 values, or empty.
  std::vector<double> freq_factors;
};

class RopeTable {
 public:
  // InvalidArgument naming the field for inconsistent options.
  static absl::StatusOr<std::unique_ptr<RopeTable>> Create(
      const RopeOptions& options);

  // Rotates x [num_heads][head_dim] in place for `position`.
  // REQUIRES: 0 <= position < max_positions.
  void Apply(float* x, int64_t num_heads, int64_t position) const;

  int64_t max_positions() const { return options_.max_positions; }

 private:
  explicit RopeTable(const RopeOptions& options) : options_(options) {}
  RopeOptions options_;
  std::vector<float> cos_;  // [max_positions][rope_dim / 2]
  std::vector<float> sin_;
};

// Llama 3 frequency scaling as per-pair divisors for RopeOptions.freq_factors.
std::vector<double> Llama3FreqFactors(int64_t rope_dim, double theta,
                                      double factor, double low_freq_factor,
                                      double high_freq_factor,
                                      int64_t original_context_length);

}  // namespace baton

#endif  // BATON_KERNELS_CPU_ROPE_H_
