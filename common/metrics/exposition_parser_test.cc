// The exposition parser on hand-written text and on prometheus-cpp's own
// serialization of every metric type.
#include "common/metrics/exposition_parser.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"

namespace baton::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ExpositionParserTest, ParsesLabelsEscapesSpecialValuesAndTimestamps) {
  const char* text =
      "# HELP a_total help text\n"
      "# TYPE a_total counter\n"
      "a_total{role=\"x\",path=\"q\\\"\\\\\\n\"} 12.5\n"
      "b 3 1700000000000\n"
      "c_bucket{le=\"+Inf\"} 4\n"
      "d -Inf\n"
      "e NaN\n"
      "\n";
  auto samples = ParseExposition(text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 5u);
  EXPECT_EQ((*samples)[0].name, "a_total");
  EXPECT_EQ((*samples)[0].labels.at("role"), "x");
  EXPECT_EQ((*samples)[0].labels.at("path"), "q\"\\\n");
  EXPECT_EQ((*samples)[0].value, 12.5);
  EXPECT_EQ((*samples)[1].value, 3.0);
  EXPECT_EQ((*samples)[2].labels.at("le"), "+Inf");
  EXPECT_TRUE(std::isinf((*samples)[3].value) && (*samples)[3].value < 0);
  EXPECT_TRUE(std::isnan((*samples)[4].value));
}

TEST(ExpositionParserTest, MalformedLinesNameTheLine) {
  for (const char* text : {"a{role=\"x\" 1\n", "a{role=x} 1\n", "a 1 2 3\n",
                           "a{r=\"1\",r=\"2\"} 1\n", "a one\n",
                           "{role=\"x\"} 1\n", "a{role=\"x\\q\"} 1\n"}) {
    auto samples = ParseExposition(absl::StrCat("# ok\nok 1\n", text));
    EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_THAT(samples.status().message(), HasSubstr("line 3")) << text;
  }
}

TEST(ExpositionParserTest, FindSampleMatchesSubsetOfLabels) {
  const char* text =
      "r_total{role=\"a\",status=\"stop\"} 1\n"
      "r_total{role=\"a\",status=\"length\"} 2\n"
      "r_total{role=\"b\",status=\"stop\"} 3\n";
  EXPECT_EQ(FindSample(text, "r_total", {{"role", "b"}}).value(), 3.0);
  EXPECT_EQ(FindSample(text, "r_total", {{"role", "a"}, {"status", "length"}})
                .value(),
            2.0);
  EXPECT_EQ(FindSample(text, "r_total", {{"role", "a"}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto missing = FindSample(text, "r_total", {{"role", "c"}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("r_total{role=\"c\"}"));
  EXPECT_EQ(FindSample(text, "other", {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ExpositionParserTest, ReadsPrometheusCppSerialization) {
  prometheus::Registry registry;
  prometheus::BuildCounter()
      .Name("t_total")
      .Help("a counter")
      .Register(registry)
      .Add({{"role", "r"}})
      .Increment(2);
  prometheus::Histogram& histogram =
      prometheus::BuildHistogram()
          .Name("t_seconds")
          .Help("a histogram")
          .Register(registry)
          .Add({{"role", "r"}},
               prometheus::Histogram::BucketBoundaries{0.1, 1.0});
  histogram.Observe(0.05);
  histogram.Observe(0.5);
  histogram.Observe(5.0);
  auto samples = ParseExposition(RenderText(registry));
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(FindSample(*samples, "t_total", {{"role", "r"}}).value(), 2.0);
  EXPECT_EQ(FindSample(*samples, "t_seconds_count", {}).value(), 3.0);
  EXPECT_DOUBLE_EQ(FindSample(*samples, "t_seconds_sum", {}).value(), 5.55);
  EXPECT_EQ(FindSample(*samples, "t_seconds_bucket", {{"le", "0.1"}}).value(),
            1.0);
  EXPECT_EQ(FindSample(*samples, "t_seconds_bucket", {{"le", "1"}}).value(),
            2.0);
  EXPECT_EQ(FindSample(*samples, "t_seconds_bucket", {{"le", "+Inf"}}).value(),
            3.0);
}

}  // namespace
}  // namespace baton::metrics
