#include "bench/serving/arrivals.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace baton::bench {
namespace {

// Mean and coefficient of variation of the gaps.
void GapStats(const std::vector<double>& offsets, double* mean, double* cv) {
  double prev = 0, sum = 0, sq = 0;
  for (double t : offsets) {
    sum += t - prev;
    sq += (t - prev) * (t - prev);
    prev = t;
  }
  *mean = sum / offsets.size();
  *cv = std::sqrt(sq / offsets.size() - *mean * *mean) / *mean;
}

TEST(BenchArrivalsTest, InfiniteRateSendsEverythingAtOnce) {
  auto offsets = ArrivalOffsets(5, ArrivalOptions{}, 1);
  ASSERT_TRUE(offsets.ok()) << offsets.status();
  EXPECT_EQ(*offsets, std::vector<double>(5, 0.0));
}

TEST(BenchArrivalsTest, PoissonGapsHaveTheRequestedMean) {
  ArrivalOptions options;
  options.request_rate = 8;
  auto offsets = ArrivalOffsets(20000, options, 7);
  ASSERT_TRUE(offsets.ok()) << offsets.status();
  double mean = 0, cv = 0;
  GapStats(*offsets, &mean, &cv);
  EXPECT_NEAR(mean, 1.0 / 8, 0.03 / 8);
  EXPECT_NEAR(cv, 1.0, 0.05);  // exponential gaps
  EXPECT_GT((*offsets)[0], 0.0);
}

TEST(BenchArrivalsTest, BurstinessShapesTheGaps) {
  ArrivalOptions options;
  options.request_rate = 4;
  options.burstiness = 0.25;  // CV of gamma(k) = 1 / sqrt(k) = 2
  auto offsets = ArrivalOffsets(40000, options, 3);
  ASSERT_TRUE(offsets.ok());
  double mean = 0, cv = 0;
  GapStats(*offsets, &mean, &cv);
  EXPECT_NEAR(mean, 0.25, 0.25 * 0.05);
  EXPECT_NEAR(cv, 2.0, 0.15);
}

TEST(BenchArrivalsTest, SameSeedSameSchedule) {
  ArrivalOptions options;
  options.request_rate = 3;
  EXPECT_EQ(*ArrivalOffsets(50, options, 11), *ArrivalOffsets(50, options, 11));
  EXPECT_NE(*ArrivalOffsets(50, options, 11), *ArrivalOffsets(50, options, 12));
}

TEST(BenchArrivalsTest, RejectsNonPositiveRateAndBurstiness) {
  for (double rate :
       {0.0, -1.0, std::nan(""), -std::numeric_limits<double>::infinity()}) {
    ArrivalOptions options;
    options.request_rate = rate;
    const absl::Status s = ArrivalOffsets(3, options, 0).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rate;
    EXPECT_NE(s.message().find("--request-rate"), absl::string_view::npos);
  }
  ArrivalOptions options;
  options.burstiness = 0;
  EXPECT_EQ(ValidateArrivalOptions(options).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::bench
