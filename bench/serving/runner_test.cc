// baton-bench's measurements against a server with known delays
// (stub_server.h): what it measures is never less than what was injected,
// and what it reports is what its records say.
#include "bench/serving/runner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
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

TEST(BenchRunnerTest, MeasuredLatenciesCoverInjectedDelays) {
  StubServerOptions stub;
  // Jittered, so that every request and token has its own delay.
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
  double itl_sum = 0;
  for (const RequestRecord& r : run->records) {
    ASSERT_TRUE(r.success) << r.request_id << ": " << r.error_message;
    ASSERT_EQ(r.output_tokens, kTokens);
    ASSERT_EQ(r.itl_ms.size(), static_cast<size_t>(kTokens - 1));
    // The stub sends token k the sum of delays 0..k after the RPC arrives,
    // which is after the send: no token is measured earlier than that.
    const double ttft = StubServer::DelayMs(stub, r.request_id, 0);
    double arrival = r.ttft_ms, due = ttft;
    EXPECT_GE(arrival, due) << r.request_id << " token 0";
    for (int k = 1; k < kTokens; ++k) {
      arrival += r.itl_ms[k - 1];
      due += StubServer::DelayMs(stub, r.request_id, k);
      EXPECT_GE(arrival, due) << r.request_id << " token " << k;
    }
    // The last token comes with the result, inside the RPC's span.
    EXPECT_NEAR(r.e2el_ms, arrival, 1e-9) << r.request_id;
    EXPECT_LE(r.e2el_ms, 1000 * (r.end_time_s - r.send_time_s) + 1e-9)
        << r.request_id;
    ttft_sum += r.ttft_ms;
    ttft_expected_sum += ttft;
    tpot_sum += (arrival - r.ttft_ms) / (kTokens - 1);
    tpot_expected_sum += (due - ttft) / (kTokens - 1);
    for (double gap : r.itl_ms) itl_sum += gap;
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
  // The reported means are those of the records.
  const BenchMetrics m = ComputeMetrics(run->records, {}, {90, 99});
  EXPECT_EQ(m.completed, kRequests);
  EXPECT_NEAR(m.ttft_ms.mean, ttft_mean, 1e-9);
  EXPECT_NEAR(m.tpot_ms.mean, tpot_mean, 1e-9);
  ASSERT_EQ(m.itl_ms.count, static_cast<size_t>(kRequests * (kTokens - 1)));
  EXPECT_NEAR(m.itl_ms.mean, itl_sum / m.itl_ms.count, 1e-9);
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
  // never less: the SLO sits just under the upper TTFT, so no request from
  // there up meets it.
  SloSpec slo;
  slo.ttft_ms = ttfts[cut + 1] - 0.25;
  slo.tpot_ms = 1000;

  constexpr int kTokens = 4;
  auto run =
      RunWorkload(Channel(*server), Prompts(kRequests, kTokens), options);
  ASSERT_TRUE(run.ok()) << run.status();
  const BenchMetrics m = ComputeMetrics(run->records, slo, {});
  EXPECT_EQ(m.completed, kRequests);
  int good = 0;
  for (const RequestRecord& r : run->records) {
    ASSERT_TRUE(r.success) << r.request_id << ": " << r.error_message;
    ASSERT_EQ(r.output_tokens, kTokens) << r.request_id;
    EXPECT_GE(r.ttft_ms, StubServer::DelayMs(stub, r.request_id, 0))
        << r.request_id;
    const double tpot = (r.e2el_ms - r.ttft_ms) / (kTokens - 1);
    good += r.ttft_ms <= *slo.ttft_ms && tpot <= *slo.tpot_ms;
  }
  EXPECT_EQ(m.good_requests, good) << "SLO ttft <= " << *slo.ttft_ms;
  EXPECT_LE(m.good_requests, cut + 1) << "SLO ttft <= " << *slo.ttft_ms;
  EXPECT_NEAR(m.request_goodput, good / m.duration_s, 1e-9);
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
  // Six requests, two at a time, each at least 40 + 2 * 5 ms.
  EXPECT_GE(run->wall_s, 3 * 0.050);

  options.max_concurrency = 0;
  options.arrivals.request_rate = 25;
  options.seed = 4;
  run = RunWorkload(Channel(*server), Prompts(8, 2), options);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<double> due = *ArrivalOffsets(8, options.arrivals, 4);
  // In order, and none before its due time (in whole nanoseconds).
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(run->records[i].sent) << i;
    EXPECT_GE(run->records[i].send_time_s, due[i] - 1e-9) << i;
    if (i > 0) {
      EXPECT_GE(run->records[i].send_time_s, run->records[i - 1].send_time_s)
          << i;
    }
  }
}

TEST(BenchRunnerTest, TimeLimitCancelsInFlightAndKeepsTheRecords) {
  StubServerOptions stub;
  stub.first_token_delay_ms = 10;
  stub.token_delay_ms = 3600e3;  // no request ends on its own
  auto server = StartStub(stub);
  ASSERT_NE(server, nullptr);
  constexpr int kRequests = 30;
  RunnerOptions options;
  // No slot frees before the limit, so at most two requests are sent.
  options.max_concurrency = 2;
  options.max_duration_s = 0.5;
  // A hang guard: an RPC the limit does not cancel fails DEADLINE_EXCEEDED.
  options.request_timeout_s = 60;
  auto run = RunWorkload(Channel(*server), Prompts(kRequests, 100), options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->hit_time_limit);
  EXPECT_FALSE(run->interrupted);
  EXPECT_GE(run->wall_s, options.max_duration_s);
  const BenchMetrics m = ComputeMetrics(run->records, {}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 0);
  EXPECT_LE(m.aborted, options.max_concurrency);
  EXPECT_EQ(m.aborted + m.not_sent, kRequests);
  for (const RequestRecord& r : run->records) {
    EXPECT_EQ(r.aborted, r.sent) << r.request_id;
    if (!r.sent) continue;
    // Cancelled once the limit had passed; what arrived before is kept.
    EXPECT_EQ(r.error_code, absl::StatusCode::kCancelled) << r.request_id;
    EXPECT_GE(r.end_time_s, options.max_duration_s) << r.request_id;
    EXPECT_LE(r.output_tokens, 1) << r.request_id;
    EXPECT_TRUE(r.itl_ms.empty()) << r.request_id;
    if (r.output_tokens == 1) {
      EXPECT_GE(r.ttft_ms, stub.first_token_delay_ms) << r.request_id;
    } else {
      EXPECT_EQ(r.ttft_ms, 0.0) << r.request_id;
    }
  }
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
  // Each request needs 4.9 s of tokens: the deadline, not the benchmark,
  // ends all three.
  EXPECT_FALSE(run->hit_time_limit);
  const BenchMetrics m = ComputeMetrics(run->records, {}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.aborted, 0);
  EXPECT_EQ(m.errors_by_code,
            (std::map<std::string, int>{{"DEADLINE_EXCEEDED", 3}}));
}

TEST(BenchRunnerTest, UnreachableServerFailsEveryRequest) {
  const std::string target = "127.0.0.1:1";
  auto channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  const absl::Status s = WaitForServer(*channel, target, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(target), absl::string_view::npos) << s;
  // Without waiting, every request fails UNAVAILABLE rather than waits for
  // the server (which would end it DEADLINE_EXCEEDED at this hang guard).
  RunnerOptions options;
  options.request_timeout_s = 60;
  auto run = RunWorkload(channel, Prompts(3, 2), options);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(ComputeMetrics(run->records, {}, {}).errors_by_code,
            (std::map<std::string, int>{{"UNAVAILABLE", 3}}));
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
