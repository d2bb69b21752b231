// CoordinatorMetrics: one request's events give exact counters and
// histogram counts and sums; labels follow the request's outcome.
#include "coordinator/service/coordinator_metrics.h"

#include "common/metrics/exposition_parser.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using metrics::FindSample;
using metrics::LabelSet;
using metrics::RenderText;

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  double Value(const std::string& name, LabelSet labels = {}) {
    labels["role"] = "coordinator";
    auto value = FindSample(RenderText(registry_), name, labels);
    EXPECT_TRUE(value.ok()) << value.status();
    return value.ok() ? *value : -1;
  }

  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
};

TEST_F(CoordinatorMetricsTest, OneRequestFromStartToFinish) {
  metrics_.OnRequestStarted();
  EXPECT_EQ(Value("baton_requests_active"), 1);
  EXPECT_EQ(Value("baton_local_prefills_total"), 0);
  metrics_.OnLocalPrefill();
  EXPECT_EQ(Value("baton_local_prefills_total"), 1);
  metrics_.OnFirstToken(0.120, 17);
  metrics_.OnTokens(1);
  metrics::HistogramAccumulator gaps = metrics_.NewInterTokenAccumulator();
  gaps.Add(0.010, 2);  // one message of two tokens after 20 ms
  metrics_.OnTokens(2);
  gaps.Add(0.030, 1);
  metrics_.OnTokens(1);
  FinishedRequest finished;
  finished.status = "length";
  finished.e2e_s = 0.5;
  finished.queue_s = 0.004;
  finished.completion_tokens = 4;
  finished.first_to_last_token_s = 0.060;
  metrics_.OnRequestFinished(finished, &gaps);
  EXPECT_EQ(gaps.count(), 0);

  EXPECT_EQ(Value("baton_requests_active"), 0);
  EXPECT_EQ(Value("baton_requests_total", {{"status", "length"}}), 1);
  EXPECT_EQ(Value("baton_requests_total", {{"status", "stop"}}), 0);
  EXPECT_EQ(Value("baton_prompt_tokens_total"), 17);
  EXPECT_EQ(Value("baton_generation_tokens_total"), 4);
  EXPECT_EQ(Value("baton_time_to_first_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value("baton_time_to_first_token_seconds_sum"), 0.120);
  EXPECT_EQ(Value("baton_time_to_first_token_seconds_bucket", {{"le", "0.1"}}),
            0);
  EXPECT_EQ(Value("baton_time_to_first_token_seconds_bucket", {{"le", "0.25"}}),
            1);
  EXPECT_EQ(Value("baton_e2e_request_latency_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value("baton_e2e_request_latency_seconds_sum"), 0.5);
  EXPECT_EQ(Value("baton_request_queue_time_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value("baton_request_queue_time_seconds_sum"), 0.004);
  EXPECT_EQ(Value("baton_time_per_output_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value("baton_time_per_output_token_seconds_sum"), 0.020);
  EXPECT_EQ(Value("baton_inter_token_latency_seconds_count"), 3);
  EXPECT_DOUBLE_EQ(Value("baton_inter_token_latency_seconds_sum"), 0.050);
  EXPECT_EQ(Value("baton_inter_token_latency_seconds_bucket", {{"le", "0.01"}}),
            2);
}

TEST_F(CoordinatorMetricsTest, FailedAndRejectedRequests) {
  metrics_.OnRequestStarted();
  FinishedRequest failed;
  failed.status = RequestStatusLabel(absl::UnavailableError("worker down"),
                                     v1::FINISH_REASON_UNSPECIFIED);
  failed.e2e_s = 2.0;  // never prefilled, no token
  metrics_.OnRequestFinished(failed, nullptr);
  metrics_.OnRequestRejected(absl::InvalidArgumentError("prompt: empty"));
  metrics_.OnRequestRejected(absl::InvalidArgumentError("model: x"));
  EXPECT_EQ(Value("baton_requests_total", {{"status", "unavailable"}}), 1);
  EXPECT_EQ(Value("baton_requests_total", {{"status", "invalid_argument"}}), 2);
  EXPECT_EQ(Value("baton_requests_active"), 0);
  EXPECT_EQ(Value("baton_e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(Value("baton_request_queue_time_seconds_count"), 0);
  EXPECT_EQ(Value("baton_time_per_output_token_seconds_count"), 0);
  EXPECT_EQ(Value("baton_time_to_first_token_seconds_count"), 0);
}

TEST(RequestStatusLabelTest, FinishReasonsAndCodes) {
  EXPECT_EQ(RequestStatusLabel(absl::OkStatus(), v1::FINISH_REASON_STOP),
            "stop");
  EXPECT_EQ(RequestStatusLabel(absl::OkStatus(), v1::FINISH_REASON_LENGTH),
            "length");
  EXPECT_EQ(RequestStatusLabel(absl::OkStatus(), v1::FINISH_REASON_CANCELLED),
            "cancelled");
  EXPECT_EQ(RequestStatusLabel(absl::CancelledError("client"),
                               v1::FINISH_REASON_UNSPECIFIED),
            "cancelled");
  EXPECT_EQ(RequestStatusLabel(absl::DeadlineExceededError("late"),
                               v1::FINISH_REASON_STOP),
            "deadline_exceeded");
}

TEST_F(CoordinatorMetricsTest, HealthyWorkersByRole) {
  std::vector<WorkerInfo> workers(5);
  workers[0].registration.role = WorkerRole::kPrefill;
  workers[1].registration.role = WorkerRole::kPrefill;
  workers[2].registration.role = WorkerRole::kDecode;
  workers[3].registration.role = WorkerRole::kDecode;
  workers[3].health = WorkerHealth::kSuspect;
  workers[4].registration.role = WorkerRole::kPrefill;
  workers[4].health = WorkerHealth::kDown;
  metrics_.SetWorkers(workers);
  EXPECT_EQ(Value("baton_workers_healthy", {{"worker_role", "prefill"}}), 2);
  EXPECT_EQ(Value("baton_workers_healthy", {{"worker_role", "decode"}}), 1);
  EXPECT_EQ(Value("baton_workers_healthy", {{"worker_role", "both"}}), 0);
  metrics_.SetWorkers({});
  EXPECT_EQ(Value("baton_workers_healthy", {{"worker_role", "prefill"}}), 0);
}

}  // namespace
}  // namespace baton::coordinator
