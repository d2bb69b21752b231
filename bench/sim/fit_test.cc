#include "bench/sim/fit.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::sim {
namespace {

using ::testing::HasSubstr;

// Prefill-like samples: x1 = l, x2 = l², over lengths 32..2048, with a
// deterministic relative perturbation of at most `noise`.
std::vector<Sample> PrefillSamples(const CostModel& m, double noise) {
  std::vector<Sample> out;
  int i = 0;
  for (double l = 32; l <= 2048; l *= 1.5, ++i) {
    for (int rep = 0; rep < 2; ++rep) {
      const double wobble = noise * std::sin(12.9898 * (2 * i + rep + 1));
      out.push_back(
          {l, l * l, (m.c0 + m.c1 * l + m.c2 * l * l) * (1 + wobble)});
    }
  }
  return out;
}

TEST(FitTest, RecoversAnExactModel) {
  const CostModel truth{0.002, 1e-3, 1e-7};
  auto fit = FitCostModel(PrefillSamples(truth, 0), "prefill");
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->model.c0 / truth.c0, 1, 1e-6);
  EXPECT_NEAR(fit->model.c1 / truth.c1, 1, 1e-6);
  EXPECT_NEAR(fit->model.c2 / truth.c2, 1, 1e-6);
  EXPECT_LT(fit->heldout_mape, 1e-9);
  EXPECT_EQ(fit->samples, 22u);
}

TEST(FitTest, NoisyTimesStayWithinTheHeldOutLimit) {
  const CostModel truth{0.004, 2e-6, 1.7e-3};
  // Decode-like: x1 = total context, x2 = batch.
  std::vector<Sample> samples;
  int i = 0;
  for (double batch : {1, 2, 4, 8, 16, 32}) {
    for (double ctx : {64, 512, 2048}) {
      const double wobble = 0.03 * std::sin(78.233 * ++i);
      samples.push_back(
          {batch * ctx, batch,
           (truth.c0 + truth.c1 * batch * ctx + truth.c2 * batch) *
               (1 + wobble)});
    }
  }
  auto fit = FitCostModel(samples, "decode");
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_LT(fit->heldout_mape, 0.05);
  EXPECT_NEAR(fit->model.c2 / truth.c2, 1, 0.2);
  EXPECT_NEAR(fit->model.c1 / truth.c1, 1, 0.3);
}

TEST(FitTest, CoefficientsAreNeverNegative) {
  // Times that an unconstrained fit would explain with a negative
  // intercept: the fit pins c0 at 0 and still describes them.
  std::vector<Sample> samples;
  for (double l = 100; l <= 1000; l += 100)
    samples.push_back({l, 0, l * 1e-3 - 0.005});
  auto fit = FitCostModel(samples, "prefill");
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->model.c0, 0);
  EXPECT_GT(fit->model.c1, 0);
  EXPECT_GE(fit->model.c2, 0);
}

TEST(FitTest, RefusesTimesTheModelCannotDescribe) {
  // Times that fall as the work grows.
  std::vector<Sample> samples;
  for (double l = 100; l <= 1000; l += 100)
    samples.push_back({l, l * l, 10 / l});
  auto fit = FitCostModel(samples, "prefill");
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fit.status().message(), HasSubstr("prefill"));
  EXPECT_THAT(fit.status().message(), HasSubstr("held-out"));
  EXPECT_THAT(fit.status().message(), HasSubstr("limit 10.0%"));
}

TEST(FitTest, RejectsTooFewOrBadSamples) {
  std::vector<Sample> five(5, Sample{1, 1, 1});
  EXPECT_THAT(FitCostModel(five, "decode").status().message(),
              HasSubstr("at least 6"));
  std::vector<Sample> zero(6, Sample{1, 1, 1});
  zero[3].y = 0;
  EXPECT_THAT(FitCostModel(zero, "decode").status().message(),
              HasSubstr("must be > 0"));
}

}  // namespace
}  // namespace baton::sim
