// The process-wide registry, scrape hooks, labels and the /metrics listener
// (fetched over HTTP).
#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "common/metrics/exposition_parser.h"
#include "common/metrics/http_get.h"
#include "common/metrics/metrics_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace baton::metrics {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Static TLS larger than the 100 KiB thread stacks a listener built on
// civetweb (as Debian builds it) starts its threads with: as in a worker
// linked with CUDA 13's cuBLASLt, cuBLAS and runtime (92 + 12 + 4 KiB of
// TLS), its pthread_create fails.
alignas(64) thread_local char big_static_tls[160 * 1024];

// Sends `request` to 127.0.0.1:`port` as is and returns everything the
// server sends back before it closes.
std::string RawExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, n);
  }
  close(fd);
  return reply;
}

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

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

TEST(MetricsTest, ServerAnswersOnlyGetAndHeadOfMetrics) {
  auto server = StartMetricsServer("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  auto missing = HttpGet((*server)->address(), "/other");
  EXPECT_THAT(missing.status().message(), HasSubstr("404"));
  EXPECT_THAT(RawExchange(port,
                          "POST /metrics HTTP/1.1\r\nHost: x\r\n"
                          "Content-Length: 0\r\n\r\n"),
              AllOf(StartsWith("HTTP/1.1 405"), HasSubstr("Allow: GET, HEAD")));
  EXPECT_THAT(RawExchange(port, "this is not HTTP\r\n\r\n"),
              StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(RawExchange(port,
                          "GET /metrics HTTP/1.1\r\nHost: x\r\n"
                          "X-Big: " +
                              std::string(20000, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 400"));
  const std::string head =
      RawExchange(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(head, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
  // A client that connects and sends nothing does not stop the others.
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_TRUE(HttpGet((*server)->address(), "/metrics?x=1").ok());
  close(idle);
}

TEST(MetricsTest, ServerStartsWhereStaticTlsOutgrowsSmallStacks) {
  big_static_tls[0] = 1;  // keeps the array in this program's TLS block
  ASSERT_EQ(big_static_tls[0], 1);
  auto server = StartMetricsServer("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(HttpGet((*server)->address(), "/metrics").ok());
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
