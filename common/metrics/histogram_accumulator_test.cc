// A HistogramAccumulator flushed into a histogram leaves it exactly as
// observing every value directly would.
#include "common/metrics/histogram_accumulator.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/metrics/exposition_parser.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"

namespace baton::metrics {
namespace {

TEST(HistogramAccumulatorTest, FlushEqualsDirectObservations) {
  const std::vector<double>& bounds = TokenLatencyBuckets();
  prometheus::Registry registry;
  auto& family = prometheus::BuildHistogram()
                     .Name("acc_seconds")
                     .Help("accumulated")
                     .Register(registry);
  prometheus::Histogram& direct = family.Add({{"how", "direct"}}, bounds);
  prometheus::Histogram& flushed = family.Add({{"how", "flushed"}}, bounds);
  HistogramAccumulator accumulator(&bounds);
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<double> log10_value(-4.0, 1.5);
  std::uniform_int_distribution<int> repeat(1, 3);
  int64_t count = 0;
  for (int i = 0; i < 500; ++i) {
    // Values on a bound itself belong to that bound's bucket (le).
    const double value = i % 50 == 0 ? bounds[static_cast<size_t>(i / 50)]
                                     : std::pow(10.0, log10_value(rng));
    const int n = repeat(rng);
    for (int k = 0; k < n; ++k) direct.Observe(value);
    accumulator.Add(value, n);
    count += n;
  }
  EXPECT_EQ(accumulator.count(), count);
  accumulator.FlushTo(flushed);
  EXPECT_EQ(accumulator.count(), 0);
  EXPECT_EQ(accumulator.sum(), 0.0);
  accumulator.FlushTo(flushed);  // empty: no change

  auto samples = ParseExposition(RenderText(registry));
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(
      FindSample(*samples, "acc_seconds_count", {{"how", "flushed"}}).value(),
      static_cast<double>(count));
  EXPECT_NEAR(
      FindSample(*samples, "acc_seconds_sum", {{"how", "flushed"}}).value(),
      FindSample(*samples, "acc_seconds_sum", {{"how", "direct"}}).value(),
      1e-9);
  int checked = 0;
  for (const Sample& s : *samples) {
    if (s.name != "acc_seconds_bucket" || s.labels.at("how") != "direct") {
      continue;
    }
    EXPECT_EQ(FindSample(*samples, "acc_seconds_bucket",
                         {{"how", "flushed"}, {"le", s.labels.at("le")}})
                  .value(),
              s.value)
        << "le=" << s.labels.at("le");
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(bounds.size()) + 1);
}

TEST(HistogramAccumulatorTest, NonPositiveCountsAreIgnored) {
  const std::vector<double> bounds = {1.0};
  HistogramAccumulator accumulator(&bounds);
  accumulator.Add(0.5, 0);
  accumulator.Add(0.5, -2);
  EXPECT_EQ(accumulator.count(), 0);
  EXPECT_EQ(accumulator.sum(), 0.0);
}

}  // namespace
}  // namespace baton::metrics
