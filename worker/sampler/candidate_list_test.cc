#include "worker/sampler/candidate_list.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace baton::sampler_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Reference {
  std::vector<int32_t> order;      // z descending, id ascending.
  std::vector<double> weight;      // By position.
  std::vector<double> cumulative;  // Inclusive, by position.
};

Reference MakeReference(const std::vector<float>& z, double temperature) {
  Reference r;
  for (int32_t t = 0; t < static_cast<int32_t>(z.size()); ++t) {
    if (z[t] != kNegInf) r.order.push_back(t);
  }
  std::sort(r.order.begin(), r.order.end(), [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  });
  const double z_max = z[r.order[0]];
  double sum = 0.0;
  for (int32_t t : r.order) {
    r.weight.push_back(std::exp((z[t] - z_max) / temperature));
    sum += r.weight.back();
    r.cumulative.push_back(sum);
  }
  return r;
}

std::vector<float> MakeLogits(std::mt19937_64& rng, size_t vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> z(vocab);
  for (float& v : z) {
    const int k = kind(rng);
    // Masked tokens, exact ties and a far outlier besides normal logits.
    v = k == 0 ? kNegInf : k == 1 ? 1.0f : normal(rng);
  }
  z[vocab / 2] = -1e30f;
  return z;
}

TEST(CandidateListTest, OrderWeightsAndCrossingsMatchAFullSort) {
  std::mt19937_64 rng(31337);
  for (size_t vocab : {1ul, 7ul, 19ul, 989ul, 20000ul}) {
    for (double temperature : {0.05, 0.7, 1.0, 3.0, 1e4}) {
      SCOPED_TRACE(testing::Message()
                   << "vocab " << vocab << " temperature " << temperature);
      std::vector<float> z = MakeLogits(rng, vocab);
      z[0] = 2.0f;  // At least one finite.
      const Reference ref = MakeReference(z, temperature);
      CandidateList list;
      list.Build(z, temperature, 0);
      ASSERT_EQ(list.size(), ref.order.size());
      EXPECT_NEAR(list.total(), ref.cumulative.back(),
                  1e-6 * ref.cumulative.back());
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      int checked = 0;
      for (int q = 0; q < 300; ++q) {
        const double x = unit(rng) * list.total();
        const auto it =
            std::upper_bound(ref.cumulative.begin(), ref.cumulative.end(), x);
        const size_t expected = it - ref.cumulative.begin();
        // Skip queries within rounding distance of a boundary.
        const double gap = 1e-6 * list.total();
        if (expected < ref.cumulative.size() &&
            (std::abs(ref.cumulative[expected] - x) < gap ||
             (expected > 0 &&
              std::abs(ref.cumulative[expected - 1] - x) < gap))) {
          continue;
        }
        ASSERT_EQ(list.FirstPositionCrossing(x, false), expected) << x;
        ++checked;
      }
      EXPECT_GT(checked, 250);
      for (size_t i = 0; i < list.size(); ++i) {
        ASSERT_EQ(list.TokenAt(i), ref.order[i]) << i;
        // Float weights: relative 1e-5, and flush near float's underflow.
        ASSERT_NEAR(list.WeightAt(i), ref.weight[i],
                    1e-5 * ref.weight[i] + 1e-37);
      }
    }
  }
}

TEST(CandidateListTest, TopKAndTruncateKeepExactPrefixes) {
  std::mt19937_64 rng(5);
  const std::vector<float> z = MakeLogits(rng, 5000);
  const Reference ref = MakeReference(z, 0.8);
  for (size_t k : {1ul, 3ul, 64ul, 1000ul, 4000ul}) {
    CandidateList list;
    list.Build(z, 0.8, k);
    ASSERT_EQ(list.size(), std::min(k, ref.order.size()));
    EXPECT_NEAR(list.total(), ref.cumulative[list.size() - 1],
                1e-6 * list.total());
    for (size_t i = 0; i < list.size(); ++i) {
      ASSERT_EQ(list.TokenAt(i), ref.order[i]);
    }
    const size_t half = (list.size() + 1) / 2;
    list.Truncate(half);
    EXPECT_EQ(list.size(), half);
    EXPECT_NEAR(list.total(), ref.cumulative[half - 1], 1e-6 * list.total());
    EXPECT_EQ(list.TokenAt(half - 1), ref.order[half - 1]);
  }
  CandidateList list;
  list.Build(z, 0.8, 0);
  for (double x : {1.0, 0.5, 0.01, 1e-6}) {
    const size_t expected = std::count_if(ref.weight.begin(), ref.weight.end(),
                                          [x](double w) { return w >= x; });
    // Float weights may straddle x differently than double ones.
    EXPECT_NEAR(static_cast<double>(list.CountWeightAtLeast(x)),
                static_cast<double>(expected), 1.0);
  }
  EXPECT_EQ(list.CountWeightAtLeast(1.0), 1u);
}

}  // namespace
}  // namespace baton::sampler_internal
