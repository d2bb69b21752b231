// The process-wide registry, scrape hooks, labels and the /metrics listener
// (fetched over HTTP).
#include "common/metrics/metrics.h"

#include <atomic>
#include <string>

#include "common/metrics/exposition_parser.h"
#include "common/metrics/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace baton::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, TextExpositionHasRegisteredCounter) {
  prometheus::Counter& counter = prometheus::BuildCounter()
                                     .Name("baton_test_exposition_total")
                                     .Help("test counter")
                                     .Register(Registry())
                                     .Add({{"role", "test"}});
  counter.Increment(3);
  const std::string text = TextExposition();
  EXPECT_THAT(text, HasSubstr("# HELP baton_test_exposition_total test "
                              "counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE baton_test_exposition_total counter"));
  auto value =
      FindSample(text, "baton_test_exposition_total", {{"role", "test"}});
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 3.0);
}

TEST(MetricsTest, ScrapeHookRunsBeforeEachCollectionWhileAlive) {
  prometheus::Gauge& gauge = prometheus::BuildGauge()
                                 .Name("baton_test_hooked")
                                 .Help("set by a scrape hook")
                                 .Register(Registry())
                                 .Add({});
  std::atomic<int> calls{0};
  auto hook = AddScrapeHook([&] { gauge.Set(++calls); });
  EXPECT_EQ(FindSample(TextExposition(), "baton_test_hooked", {}).value(), 1.0);
  EXPECT_EQ(FindSample(TextExposition(), "baton_test_hooked", {}).value(), 2.0);
  hook.reset();
  EXPECT_EQ(FindSample(TextExposition(), "baton_test_hooked", {}).value(), 2.0);
  EXPECT_EQ(calls.load(), 2);
}

TEST(MetricsTest, RenderTextRunsNoHooks) {
  prometheus::Registry registry;
  prometheus::Gauge& gauge = prometheus::BuildGauge()
                                 .Name("baton_test_private")
                                 .Help("in a private registry")
                                 .Register(registry)
                                 .Add({});
  gauge.Set(7);
  int calls = 0;
  auto hook = AddScrapeHook([&] { ++calls; });
  EXPECT_EQ(FindSample(RenderText(registry), "baton_test_private", {}).value(),
            7.0);
  EXPECT_EQ(calls, 0);
}

TEST(MetricsTest, StatusCodeLabels) {
  EXPECT_EQ(StatusCodeLabel(absl::StatusCode::kOk), "ok");
  EXPECT_EQ(StatusCodeLabel(absl::StatusCode::kDeadlineExceeded),
            "deadline_exceeded");
  EXPECT_EQ(StatusCodeLabel(absl::StatusCode::kUnavailable), "unavailable");
}

TEST(MetricsTest, BucketsIncrease) {
  for (const std::vector<double>* buckets :
       {&RequestLatencyBuckets(), &TokenLatencyBuckets()}) {
    ASSERT_GE(buckets->size(), 10u);
    for (size_t i = 1; i < buckets->size(); ++i) {
      EXPECT_LT((*buckets)[i - 1], (*buckets)[i]);
    }
  }
  EXPECT_LE(RequestLatencyBuckets().front(), 0.001);
  EXPECT_GE(RequestLatencyBuckets().back(), 300.0);
}

TEST(MetricsTest, ServerServesMetricsOverHttp) {
  prometheus::BuildCounter()
      .Name("baton_test_http_total")
      .Help("fetched over HTTP")
      .Register(Registry())
      .Add({{"role", "test"}})
      .Increment(5);
  prometheus::Gauge& hooked = prometheus::BuildGauge()
                                  .Name("baton_test_http_hooked")
                                  .Help("set by a scrape hook")
                                  .Register(Registry())
                                  .Add({});
  auto hook = AddScrapeHook([&] { hooked.Set(42); });
  auto server = StartMetricsServer("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  EXPECT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(address, "127.0.0.1:0");
  auto body = HttpGet(address, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  auto value = FindSample(*body, "baton_test_http_total", {{"role", "test"}});
  ASSERT_TRUE(value.ok()) << value.status() << "\n" << *body;
  EXPECT_EQ(*value, 5.0);
  EXPECT_EQ(FindSample(*body, "baton_test_http_hooked", {}).value(), 42.0);
  // The same port cannot be bound twice.
  auto second = StartMetricsServer(address);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsTest, MalformedListenAddressIsInvalidArgument) {
  for (const char* listen : {"", "127.0.0.1", ":80", "host:port",
                             "127.0.0.1:70000", "127.0.0.1:-1"}) {
    auto server = StartMetricsServer(listen);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << listen << "'";
  }
}

}  // namespace
}  // namespace baton::metrics
