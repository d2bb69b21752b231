// The candidates of one sampling draw, in final order, materialized lazily.
//
// Order: penalized logit z descending, ties by token id ascending (the same
// as probability descending). Weight of a candidate: w = exp((z - z_max) /
// temperature), in (0, 1] for the best one (0 only by underflow).
//
// Build() makes a counting sort of the candidates into up to kNumBuckets
// buckets of equal width in log(w) (each bucket a contiguous z range, so
// buckets are contiguous ranges of the final order) and sorts a bucket only
// when a query reads inside it.
// A draw therefore costs a few linear passes plus sorting one or two small
// buckets, not a sort of the vocabulary.
//
// Cumulative mass at position i, the quantity every query uses, is defined
// as: (sum of the masses of the buckets before i's bucket, each summed in
// token id order, or in final order for the bucket Truncate() cut) + (the
// weights of i's bucket up to i, in final order). It equals the exact
// cumulative probability up to rounding, and is a deterministic function of
// the logits and temperature.
#ifndef BATON_WORKER_SAMPLER_CANDIDATE_LIST_H_
#define BATON_WORKER_SAMPLER_CANDIDATE_LIST_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace baton::sampler_internal {

// exp(-nats), evaluated in float (the weights feed a sampling draw, where
// float's ~1e-7 relative error is immaterial) for speed.
inline double WeightOfNats(double nats) {
  return std::exp(-static_cast<float>(nats));
}

class CandidateList {
 public:
  // At most this many buckets, ~16 candidates each.
  static constexpr int kNumBuckets = 4096;
  // Tokens more than this many nats below the best share the last bucket.
  static constexpr double kMaxBucketedNats = 64.0;

  // z: [vocab] penalized logits; -inf entries are not candidates.
  // REQUIRES: some entry of z is finite; temperature > 0. The list keeps
  // only the first max_size candidates (top-k) when 0 < max_size. `z` must
  // outlive every later call.
  void Build(std::span<const float> z, double temperature, size_t max_size);

  size_t size() const { return size_; }
  // Sum of the weights of the kept candidates.
  double total() const { return total_; }

  // Candidate at position i of the final order. REQUIRES: i < size().
  int32_t TokenAt(size_t i);
  double WeightAt(size_t i);

  // Smallest position whose cumulative mass is > x (>= x if or_equal). If
  // the bucket that crosses x does not cross it position by position (a
  // rounding difference between the two sums), its last position with
  // positive weight. size() if no bucket crosses x.
  size_t FirstPositionCrossing(double x, bool or_equal);

  // Number of kept candidates with weight >= x (a prefix of the order).
  size_t CountWeightAtLeast(double x) const;

  // Keeps the first n candidates. REQUIRES: 1 <= n <= size().
  void Truncate(size_t n);

 private:
  int BucketOf(size_t position) const;
  // Puts bucket b's first (end - begin_[b]) candidates in final order.
  void SortBucketPrefix(int b, size_t end);
  void SortBucket(int b);
  double Weight(int32_t token) const {
    return WeightOfNats((z_max_ - z_[token]) * inv_temperature_);
  }

  std::span<const float> z_;
  double z_max_ = 0.0;
  double inv_temperature_ = 1.0;
  size_t size_ = 0;
  double total_ = 0.0;
  // Buckets [0, num_buckets_) are kept. Bucket b holds positions
  // [begin_[b], begin_[b + 1]).
  int num_buckets_ = 0;
  std::vector<uint32_t> begin_;
  std::vector<double> mass_;
  std::vector<double> mass_before_;
  std::vector<uint8_t> sorted_;
  // [vocab]: bucket of each token, kNumBuckets for -inf.
  std::vector<uint16_t> bucket_of_token_;
  // [size_]: token ids and their weights by position.
  std::vector<int32_t> order_;
  std::vector<double> weight_;
};

}  // namespace baton::sampler_internal

#endif  // BATON_WORKER_SAMPLER_CANDIDATE_LIST_H_
