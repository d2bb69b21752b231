#include "worker/sampler/candidate_list.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"

namespace baton::sampler_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

void CandidateList::Build(std::span<const float> z, double temperature,
                          size_t max_size) {
  BATON_CHECK_GT(temperature, 0.0);
  z_ = z;
  // Below 1e-300 every non-best token already has weight 0.
  inv_temperature_ = 1.0 / std::max(temperature, 1e-300);
  float z_max = kNegInf;
  float z_min = std::numeric_limits<float>::infinity();
  size_t num_finite = 0;
  for (float v : z) {
    if (v == kNegInf) continue;
    z_max = std::max(z_max, v);
    z_min = std::min(z_min, v);
    ++num_finite;
  }
  BATON_CHECK_GT(num_finite, 0u);
  z_max_ = z_max;

  // Bucket = floor(u * scale) with u = (z_max - z) / temperature = -log(w),
  // capped at the last bucket; monotone in z. ~16 candidates per bucket.
  const int num_buckets =
      static_cast<int>(std::clamp<size_t>(num_finite / 16, 1, kNumBuckets));
  const double u_range =
      std::min((z_max_ - z_min) * inv_temperature_, kMaxBucketedNats);
  const double scale = u_range > 0.0 ? (num_buckets - 1) / u_range : 0.0;
  begin_.assign(num_buckets + 1, 0);
  bucket_of_token_.resize(z.size());
  int last_bucket = 0;
  for (size_t t = 0; t < z.size(); ++t) {
    if (z[t] == kNegInf) {
      bucket_of_token_[t] = kNumBuckets;
      continue;
    }
    const double x = (z_max_ - z[t]) * inv_temperature_ * scale;
    const int b = x < num_buckets - 1 ? static_cast<int>(x) : num_buckets - 1;
    bucket_of_token_[t] = static_cast<uint16_t>(b);
    ++begin_[b + 1];
    last_bucket = std::max(last_bucket, b);
  }
  num_buckets_ = last_bucket + 1;
  const bool top_k = max_size > 0 && max_size < num_finite;
  size_t count = 0;
  for (int b = 0; b < num_buckets_; ++b) {
    count += begin_[b + 1];
    begin_[b + 1] = static_cast<uint32_t>(count);
    if (top_k && count >= max_size) {
      num_buckets_ = b + 1;
      break;
    }
  }
  size_ = count;

  // Counting-sort scatter; within a bucket tokens stay in id order.
  std::vector<uint32_t> cursor(begin_.begin(), begin_.begin() + num_buckets_);
  order_.resize(size_);
  weight_.resize(size_);
  mass_.assign(num_buckets_, 0.0);
  for (size_t t = 0; t < z.size(); ++t) {
    const int b = bucket_of_token_[t];
    if (b >= num_buckets_) continue;
    const uint32_t pos = cursor[b]++;
    const double w = Weight(static_cast<int32_t>(t));
    order_[pos] = static_cast<int32_t>(t);
    weight_[pos] = w;
    mass_[b] += w;
  }
  sorted_.assign(num_buckets_, 0);
  mass_before_.assign(num_buckets_ + 1, 0.0);
  for (int b = 0; b < num_buckets_; ++b) {
    mass_before_[b + 1] = mass_before_[b] + mass_[b];
  }
  total_ = mass_before_[num_buckets_];
  if (top_k) Truncate(max_size);
}

int CandidateList::BucketOf(size_t position) const {
  BATON_CHECK_LT(position, size_);
  const auto end = begin_.begin() + num_buckets_ + 1;
  return static_cast<int>(std::upper_bound(begin_.begin(), end, position) -
                          begin_.begin() - 1);
}

void CandidateList::SortBucket(int b) { SortBucketPrefix(b, begin_[b + 1]); }

void CandidateList::SortBucketPrefix(int b, size_t end) {
  if (sorted_[b]) return;
  const std::span<const float> z = z_;
  const auto more = [z](int32_t a, int32_t c) {
    return z[a] > z[c] || (z[a] == z[c] && a < c);
  };
  const auto first = order_.begin() + begin_[b];
  if (end < begin_[b + 1]) {
    std::nth_element(first, order_.begin() + end,
                     order_.begin() + begin_[b + 1], more);
  }
  std::sort(first, order_.begin() + end, more);
  for (size_t i = begin_[b]; i < end; ++i) weight_[i] = Weight(order_[i]);
  sorted_[b] = end == begin_[b + 1];
}

int32_t CandidateList::TokenAt(size_t i) {
  SortBucket(BucketOf(i));
  return order_[i];
}

double CandidateList::WeightAt(size_t i) {
  SortBucket(BucketOf(i));
  return weight_[i];
}

size_t CandidateList::FirstPositionCrossing(double x, bool or_equal) {
  const auto crosses = [x, or_equal](double c) {
    return or_equal ? c >= x : c > x;
  };
  int b = 0;
  while (b < num_buckets_ && !crosses(mass_before_[b + 1])) ++b;
  if (b == num_buckets_) {
    // Only by rounding: fall back to the last bucket with positive mass.
    b = num_buckets_ - 1;
    while (b > 0 && !(mass_[b] > 0.0)) --b;
  }
  SortBucket(b);
  double cumulative = mass_before_[b];
  size_t last_positive = begin_[b];
  for (size_t i = begin_[b]; i < begin_[b + 1]; ++i) {
    cumulative += weight_[i];
    if (weight_[i] > 0.0) last_positive = i;
    if (crosses(cumulative)) return i;
  }
  return last_positive;
}

size_t CandidateList::CountWeightAtLeast(double x) const {
  size_t n = 0;
  for (size_t i = 0; i < size_; ++i) n += weight_[i] >= x;
  return n;
}

void CandidateList::Truncate(size_t n) {
  BATON_CHECK_GE(n, 1u);
  BATON_CHECK_LE(n, size_);
  if (n == size_) return;
  const int b = BucketOf(n - 1);
  SortBucketPrefix(b, n);
  sorted_[b] = 1;
  num_buckets_ = b + 1;
  begin_[b + 1] = static_cast<uint32_t>(n);
  double mass = 0.0;
  for (size_t i = begin_[b]; i < n; ++i) mass += weight_[i];
  mass_[b] = mass;
  mass_before_[b + 1] = mass_before_[b] + mass;
  total_ = mass_before_[b + 1];
  size_ = n;
}

}  // namespace baton::sampler_internal
