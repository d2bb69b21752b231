// Admission on a real cluster (coordinator/admission.h): a request the
// coordinator cannot serve in time is refused on arrival with
// RESOURCE_EXHAUSTED and a retry delay (gRPC trailing metadata; HTTP 429
// with Retry-After), counted in baton_requests_shed_total, and nothing it
// refused holds anything afterwards. The refusals here come at known
// points (a worker stopped at its first prefill step, a rate the worker
// measured), not from timing.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/http_get.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/cluster_test_util.h"
#include "tests/cluster/local_cluster.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

v1::GetClusterStatusResponse Status(LocalCluster& cluster) {
  v1::GetClusterStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const grpc::Status rpc =
      cluster.baton().GetClusterStatus(&context, {}, &status);
  EXPECT_TRUE(rpc.ok()) << rpc.error_message();
  return status;
}

// Polls GetClusterStatus until `done` holds; false after `timeout` (which
// only stops a hang).
template <typename Predicate>
bool WaitForStatus(LocalCluster& cluster, Predicate done,
                   absl::Duration timeout = DefaultTestDeadline()) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done(Status(cluster))) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// "HTTP/1.1 429 ...\r\nRetry-After: 1\r\n...\r\n\r\n{body}" of a completion
// request through the HTTP API.
std::string PostCompletion(LocalCluster& cluster) {
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  const grpc::Status listed = cluster.baton().ListModels(&context, {}, &models);
  EXPECT_TRUE(listed.ok() && models.models_size() == 1)
      << listed.error_message();
  if (models.models_size() == 0) return "";
  auto out = RunCommand(
      absl::StrCat("curl -sS -i --max-time 60 http://", cluster.http_address(),
                   "/v1/completions -H 'Content-Type: application/json' -d "
                   "'{\"model\": \"",
                   models.models(0).id(),
                   "\", \"prompt\": \"Count to three.\", \"max_tokens\": 4}'"));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

double ShedCount(LocalCluster& cluster, const std::string& reason) {
  absl::StatusOr<std::string> metrics =
      metrics::HttpGet(cluster.http_address(), "/metrics");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (!metrics.ok()) return -1;
  const std::string key = absl::StrCat("baton_requests_shed_total{reason=\"",
                                       reason, "\",role=\"coordinator\"} ");
  const size_t at = metrics->find(key);
  if (at == std::string::npos) return 0;
  return std::stod(metrics->substr(at + key.size()));
}

// Starts two requests (greedy and seeded) on `c`, whose worker stops at its
// first prefill step (--fault=prefill_step:stop), and returns once the
// worker stopped and the coordinator counts both: they wait for their first
// token until the caller continues the worker and joins `threads`.
void HoldTwo(LocalCluster& c, std::vector<StreamResult>* results,
             std::vector<std::thread>* threads, int* stopped) {
  const std::vector<v1::GenerateRequest> requests = {
      ChatRequest("Name a colour.", 6, 0, 1),
      ChatRequest("Name a fruit.", 6, 0.7, 2)};
  results->resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    threads->emplace_back([&c, results, requests, i] {
      (*results)[i] = RunGenerate(c.baton(), requests[i]);
    });
  }
  absl::StatusOr<int> worker = c.WaitForStoppedWorker(DefaultTestDeadline());
  ASSERT_TRUE(worker.ok()) << worker.status();
  *stopped = *worker;
  ASSERT_TRUE(WaitForStatus(c, [](const v1::GetClusterStatusResponse& s) {
    return s.active_requests() == 2;
  })) << "the two requests never both reached the coordinator";
}

TEST(ClusterAdmissionTest, AFullQueueIsRefusedAtOnceWithARetryDelay) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 1;
  options.http = true;
  // The worker stops itself at its first prefill step and stays stopped
  // until the test continues it: a lease long enough that it stays up.
  options.lease_ttl_ms = 600000;
  options.coordinator_flags = {"--max_waiting_requests=2"};
  options.worker_flags = {"--fault=prefill_step:stop"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // Two requests wait for their first token behind the stopped worker.
  std::vector<StreamResult> results(2);
  std::vector<std::thread> threads;
  int stopped = -1;
  ASSERT_NO_FATAL_FAILURE(HoldTwo(c, &results, &threads, &stopped));

  // A third: refused on arrival, naming the limit, with a retry delay.
  const StreamResult refused =
      RunGenerate(c.baton(), ChatRequest("Name a tree.", 6, 0, 3));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << Describe(refused);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("--max_waiting_requests"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("2 requests"));
  EXPECT_EQ(refused.messages, 0);
  ASSERT_TRUE(refused.retry_after.has_value());
  EXPECT_EQ(*refused.retry_after, absl::Seconds(1));

  // The same through the HTTP API: 429 with Retry-After.
  const std::string http = PostCompletion(c);
  EXPECT_THAT(http, HasSubstr("HTTP/1.1 429"));
  EXPECT_THAT(http, HasSubstr("Retry-After: 1\r\n"));
  EXPECT_THAT(http, HasSubstr("--max_waiting_requests"));
  EXPECT_EQ(ShedCount(c, "queue_full"), 2);

  // The worker goes on: the admitted requests complete, and the queue has
  // room again.
  c.workers()[static_cast<size_t>(stopped)].process->Signal(SIGCONT);
  for (std::thread& t : threads) t.join();
  for (const StreamResult& r : results) {
    EXPECT_TRUE(r.status.ok()) << Describe(r);
    EXPECT_TRUE(r.has_result) << Describe(r);
    EXPECT_EQ(r.tokens.size(), 6u) << Describe(r);
  }
  const StreamResult after =
      RunGenerate(c.baton(), ChatRequest("Name a tree.", 6, 0, 3));
  EXPECT_TRUE(after.status.ok()) << Describe(after);
  EXPECT_EQ(after.tokens.size(), 6u) << Describe(after);
  EXPECT_TRUE(c.WaitAllFree(DefaultTestDeadline()).ok());
  EXPECT_TRUE(c.Stop().ok());
}

// The bound on streams (--max_running_requests) counts admitted requests
// in any phase: with two held behind a stopped worker, a third is refused
// at once even though the waiting queue is unbounded.
TEST(ClusterAdmissionTest, TooManyRunningStreamsAreRefusedAtOnce) {
  LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = 1;
  options.lease_ttl_ms = 600000;
  options.http = true;  // for /metrics
  options.coordinator_flags = {"--max_waiting_requests=0",
                               "--max_running_requests=2"};
  options.worker_flags = {"--fault=prefill_step:stop"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  std::vector<StreamResult> results(2);
  std::vector<std::thread> threads;
  int stopped = -1;
  ASSERT_NO_FATAL_FAILURE(HoldTwo(c, &results, &threads, &stopped));
  const StreamResult refused =
      RunGenerate(c.baton(), ChatRequest("Name a tree.", 6, 0, 3));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << Describe(refused);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("2 requests are running"));
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("--max_running_requests"));
  EXPECT_EQ(ShedCount(c, "running_full"), 1);
  c.workers()[static_cast<size_t>(stopped)].process->Signal(SIGCONT);
  for (std::thread& t : threads) t.join();
  for (const StreamResult& r : results) {
    EXPECT_TRUE(r.status.ok() && r.has_result) << Describe(r);
  }
  // Ended requests leave room.
  const StreamResult later =
      RunGenerate(c.baton(), ChatRequest("Name a tree.", 6, 0, 3));
  EXPECT_TRUE(later.status.ok() && later.has_result) << Describe(later);
  EXPECT_TRUE(c.Stop().ok());
}

TEST(ClusterAdmissionTest, AnEstimateAboveTheTtftSloIsRefusedOnArrival) {
  LocalClusterOptions options;
  options.prefill = 1;
  options.decode = 1;
  options.http = true;
  // 1 ms: any prompt is estimated above it once the worker has measured
  // its rate (checked below from the rate the worker reports); before that
  // there is no estimate (AdmissionTest.NoEstimateWhileAWorkerHasNotMeasured
  // ItsRate).
  options.coordinator_flags = {"--ttft_slo_ms=1"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // The prefill worker's heartbeats carry the rate it measured (its
  // warm-up prefill at start counts).
  double rate = 0;
  ASSERT_TRUE(WaitForStatus(c, [&](const v1::GetClusterStatusResponse& s) {
    for (const v1::WorkerStatus& w : s.workers()) {
      if (w.role() == v1::WORKER_ROLE_PREFILL) {
        rate = w.load().prefill_tokens_per_second();
      }
    }
    return rate > 0;
  })) << "the prefill worker never reported a prefill rate";
  // A chat prompt has well over 10 tokens (the template alone has more).
  std::fprintf(stderr, "prefill rate %.0f tokens/s: 10 tokens = %.2f ms\n",
               rate, 1e4 / rate);
  ASSERT_GT(1e4 / rate, 1.0) << "this host prefills too fast for a 1 ms SLO";

  const v1::GenerateRequest request = ChatRequest("Name a colour.", 4, 0, 1);
  const StreamResult refused = RunGenerate(c.baton(), request);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << Describe(refused);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("--ttft_slo_ms"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("tokens/s"));
  ASSERT_TRUE(refused.retry_after.has_value());
  EXPECT_GE(*refused.retry_after, absl::Seconds(1));

  const std::string http = PostCompletion(c);
  EXPECT_THAT(http, HasSubstr("HTTP/1.1 429"));
  EXPECT_THAT(http, HasSubstr("Retry-After: "));
  EXPECT_THAT(http, HasSubstr("--ttft_slo_ms"));
  EXPECT_EQ(ShedCount(c, "ttft_slo"), 2);
  EXPECT_TRUE(c.WaitAllFree(DefaultTestDeadline()).ok());
  EXPECT_TRUE(c.Stop().ok());
}

}  // namespace
}  // namespace baton::testing
