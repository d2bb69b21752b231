// baton-bench's measurements against a server with known delays
// (stub_server.h): what it reports must be what was injected.
#include "bench/serving/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/serving/metrics.h"
#include "bench/serving/stub_server.h"
#include "gtest/gtest.h"

namespace baton::bench {
namespace {

std::vector<BenchPrompt> Prompts(int n, int output_len) {
  std::vector<BenchPrompt> prompts(n);
  for (BenchPrompt& p : prompts) {
    p.token_ids = {1001, 1002, 1003};
    p.input_len = 3;
    p.output_len = output_len;
  }
  return prompts;
}

// A connected channel, so that no request pays for the connection.
std::shared_ptr<grpc::Channel> Channel(const StubServer& server) {
  auto channel =
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  EXPECT_TRUE(WaitForServer(*channel, server.address(), absl::Seconds(5)).ok());
  return channel;
}

std::unique_ptr<StubServer> StartStub(const StubServerOptions& options) {
  auto server = StubServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(BenchRunnerTest, TtftAndTpotMatchInjectedDelays) {
  StubServerOptions stub;
  // Long enough that a busy machine's scheduling delays (a few ms per
  // wakeup, on the stub's side as much as on the client's) stay under 5%.
  stub.first_token_delay_ms = 300;
  stub.first_token_jitter_ms = 50;
  stub.token_delay_ms = 12;
  stub.token_jitter_ms = 4;
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  constexpr int kRequests = 16, kTokens = 20;
  RunnerOptions options;
  options.request_id_prefix = "timing-";
  options.max_concurrency = 8;
  auto run =
      RunWorkload(Channel(*server), Prompts(kRequests, kTokens), options);
  ASSERT_TRUE(run.ok()) << run.status();

  double ttft_sum = 0, ttft_expected_sum = 0;
  double tpot_sum = 0, tpot_expected_sum = 0;
  int ttft_within = 0, tpot_within = 0;
  for (const RequestRecord& r : run->records) {
    ASSERT_TRUE(r.success) << r.request_id << ": " << r.error_message;
    EXPECT_EQ(r.output_tokens, kTokens);
    EXPECT_EQ(r.itl_ms.size(), static_cast<size_t>(kTokens - 1));
    const double ttft = StubServer::DelayMs(stub, r.request_id, 0);
    double decode = 0;
    for (int k = 1; k < kTokens; ++k) {
      decode += StubServer::DelayMs(stub, r.request_id, k);
    }
    const double tpot = decode / (kTokens - 1);
    ttft_sum += r.ttft_ms;
    ttft_expected_sum += ttft;
    tpot_sum += *TpotMs(r);
    tpot_expected_sum += tpot;
    ttft_within += std::abs(r.ttft_ms - ttft) <= 0.05 * ttft;
    tpot_within += std::abs(*TpotMs(r) - tpot) <= 0.05 * tpot;
  }
  const double ttft_mean = ttft_sum / kRequests;
  const double ttft_expected = ttft_expected_sum / kRequests;
  const double tpot_mean = tpot_sum / kRequests;
  const double tpot_expected = tpot_expected_sum / kRequests;
  std::printf("TTFT measured %.3f ms, injected %.3f ms (%+.2f%%)\n", ttft_mean,
              ttft_expected, 100 * (ttft_mean / ttft_expected - 1));
  std::printf("TPOT measured %.3f ms, injected %.3f ms (%+.2f%%)\n", tpot_mean,
              tpot_expected, 100 * (tpot_mean / tpot_expected - 1));
  std::printf("client CPU %.1f%% of one core over %.2f s\n",
              100 * (run->cpu_user_s + run->cpu_system_s) / run->wall_s,
              run->wall_s);
  EXPECT_NEAR(ttft_mean, ttft_expected, 0.05 * ttft_expected);
  EXPECT_NEAR(tpot_mean, tpot_expected, 0.05 * tpot_expected);
  // Each request on its own too (a loaded machine may delay a few).
  EXPECT_GE(ttft_within, kRequests * 9 / 10);
  EXPECT_GE(tpot_within, kRequests * 9 / 10);
  const BenchMetrics m = ComputeMetrics(run->records, {}, {90, 99});
  EXPECT_NEAR(m.itl_ms.mean, stub.token_delay_ms, 0.05 * stub.token_delay_ms);
  EXPECT_GT(run->cpu_user_s + run->cpu_system_s, 0);
}

TEST(BenchRunnerTest, GoodputCountIsExact) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 300;
  stub.first_token_jitter_ms = 200;  // TTFT in [100, 500]
  stub.token_delay_ms = 5;
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  constexpr int kRequests = 20;
  RunnerOptions options;
  options.request_id_prefix = "goodput-";
  // The SLO goes in the widest gap between the middle requests' TTFTs.
  std::vector<double> ttfts;
  for (int i = 0; i < kRequests; ++i) {
    ttfts.push_back(StubServer::DelayMs(stub, absl::StrCat("goodput-", i), 0));
  }
  std::sort(ttfts.begin(), ttfts.end());
  int cut = 3;
  for (int i = 3; i < kRequests - 4; ++i) {
    if (ttfts[i + 1] - ttfts[i] > ttfts[cut + 1] - ttfts[cut]) cut = i;
  }
  ASSERT_GE(ttfts[cut + 1] - ttfts[cut], 20.0) << "no clear gap for the SLO";
  // A measured TTFT is the injected one plus transport and scheduling,
  // never less: the SLO sits just under the upper TTFT, leaving the whole
  // gap as margin for the lower one.
  SloSpec slo;
  slo.ttft_ms = ttfts[cut + 1] - 0.25;
  slo.tpot_ms = 1000;

  auto run = RunWorkload(Channel(*server), Prompts(kRequests, 4), options);
  ASSERT_TRUE(run.ok()) << run.status();
  const BenchMetrics m = ComputeMetrics(run->records, slo, {});
  EXPECT_EQ(m.completed, kRequests);
  EXPECT_EQ(m.good_requests, cut + 1) << "SLO ttft <= " << *slo.ttft_ms;
  EXPECT_NEAR(m.request_goodput, (cut + 1) / m.duration_s, 1e-9);
}

TEST(BenchRunnerTest, ErrorsAreCountedByCode) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 5;
  stub.token_delay_ms = 1;
  stub.fail_code = grpc::StatusCode::UNAVAILABLE;
  stub.fail_every = 3;
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  auto run = RunWorkload(Channel(*server), Prompts(9, 3), RunnerOptions{});
  ASSERT_TRUE(run.ok()) << run.status();
  BenchMetrics m = ComputeMetrics(run->records, {}, {});
  EXPECT_EQ(m.completed, 6);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.errors_by_code, (std::map<std::string, int>{{"UNAVAILABLE", 3}}));

  // In-band failures (after the first token) count by their error_code.
  stub.fail_code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  stub.fail_every = 0;
  stub.fail_in_band = true;
  server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  run = RunWorkload(Channel(*server), Prompts(4, 3), RunnerOptions{});
  ASSERT_TRUE(run.ok()) << run.status();
  m = ComputeMetrics(run->records, {}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.errors_by_code,
            (std::map<std::string, int>{{"RESOURCE_EXHAUSTED", 4}}));
  EXPECT_EQ(run->records[0].finish_reason, "error");
}

TEST(BenchRunnerTest, MaxConcurrencyAndRateShapeTheSends) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 40;
  stub.token_delay_ms = 5;
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  RunnerOptions options;
  options.max_concurrency = 2;
  auto run = RunWorkload(Channel(*server), Prompts(6, 3), options);
  ASSERT_TRUE(run.ok()) << run.status();
  // At every send, at most one other request is in flight.
  for (const RequestRecord& a : run->records) {
    int overlapping = 0;
    for (const RequestRecord& b : run->records) {
      overlapping +=
          b.send_time_s <= a.send_time_s && b.end_time_s > a.send_time_s;
    }
    EXPECT_LE(overlapping, 2) << a.request_id;
  }
  EXPECT_GE(run->wall_s, 3 * 0.050);

  options.max_concurrency = 0;
  options.arrivals.request_rate = 25;
  options.seed = 4;
  run = RunWorkload(Channel(*server), Prompts(8, 2), options);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<double> due = *ArrivalOffsets(8, options.arrivals, 4);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(run->records[i].send_time_s, due[i], 0.010) << i;
  }
}

TEST(BenchRunnerTest, TimeLimitCancelsInFlightAndKeepsTheRecords) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 10;
  stub.token_delay_ms = 50;  // 100 tokens: 5 s per request
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  RunnerOptions options;
  options.arrivals.request_rate = 10;
  options.max_duration_s = 0.5;
  const auto start = std::chrono::steady_clock::now();
  auto run = RunWorkload(Channel(*server), Prompts(30, 100), options);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->hit_time_limit);
  EXPECT_LT(took, 2.0);
  const BenchMetrics m = ComputeMetrics(run->records, {}, {});
  EXPECT_GT(m.aborted, 0);
  EXPECT_GT(m.not_sent, 0);
  EXPECT_EQ(m.aborted + m.not_sent, 30);
  EXPECT_EQ(m.failed, 0);
  // What arrived before the limit is kept.
  EXPECT_GT(run->records[0].output_tokens, 0);
}

TEST(BenchRunnerTest, RequestDeadlineIsAFailure) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 10;
  stub.token_delay_ms = 100;
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  RunnerOptions options;
  options.request_timeout_s = 0.2;
  auto run = RunWorkload(Channel(*server), Prompts(3, 50), options);
  ASSERT_TRUE(run.ok()) << run.status();
  const BenchMetrics m = ComputeMetrics(run->records, {}, {});
  EXPECT_EQ(m.errors_by_code,
            (std::map<std::string, int>{{"DEADLINE_EXCEEDED", 3}}));
  EXPECT_LT(run->wall_s, 1.5);
}

TEST(BenchRunnerTest, UnreachableServerFailsFast) {
  const std::string target = "127.0.0.1:1";
  auto channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = WaitForServer(*channel, target, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(target), absl::string_view::npos) << s;
  // Without waiting, every request fails rather than hangs.
  auto run = RunWorkload(channel, Prompts(3, 2), RunnerOptions{});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(
      ComputeMetrics(run->records, {}, {}).errors_by_code.at("UNAVAILABLE"), 3);
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      5.0);
}

TEST(BenchRunnerTest, RejectsInvalidOptions) {
  RunnerOptions options;
  options.arrivals.request_rate = -1;
  EXPECT_EQ(ValidateRunnerOptions(options).code(),
            absl::StatusCode::kInvalidArgument);
  options = RunnerOptions{};
  options.max_concurrency = -2;
  EXPECT_EQ(ValidateRunnerOptions(options).code(),
            absl::StatusCode::kInvalidArgument);
  options = RunnerOptions{};
  options.request_timeout_s = 0;
  EXPECT_EQ(ValidateRunnerOptions(options).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::bench
