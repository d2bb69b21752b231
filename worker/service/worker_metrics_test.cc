// WorkerMetrics: events and refreshes land on exactly the series they
// name, labelled with the worker's role.
#include "worker/service/worker_metrics.h"

#include <chrono>

#include "common/metrics/exposition_parser.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using metrics::FindSample;
using metrics::LabelSet;
using metrics::RenderText;

class WorkerMetricsTest : public ::testing::Test {
 protected:
  double Value(const std::string& name, LabelSet labels = {}) {
    labels["role"] = "decode";
    auto value = FindSample(RenderText(registry_), name, labels);
    EXPECT_TRUE(value.ok()) << value.status();
    return value.ok() ? *value : -1;
  }

  prometheus::Registry registry_;
  WorkerMetrics metrics_{registry_, "decode"};
};

TEST_F(WorkerMetricsTest, CountsTokensAndRequests) {
  metrics_.OnPrefilled(40);
  metrics_.OnPrefilled(2);
  metrics_.OnDecodeTokens(7);
  metrics_.OnDecodeTokens(0);
  metrics_.OnDecodeTokens(1);
  metrics_.OnRequestEnded("decode", "length");
  metrics_.OnRequestEnded("decode", "length");
  metrics_.OnRequestEnded("prefill", "ok");
  metrics_.OnRequestEnded("decode", "not_found");
  EXPECT_EQ(Value("baton_worker_prefill_tokens_total"), 42);
  EXPECT_EQ(Value("baton_worker_decode_tokens_total"), 8);
  EXPECT_EQ(Value("baton_worker_requests_total",
                  {{"phase", "decode"}, {"status", "length"}}),
            2);
  EXPECT_EQ(Value("baton_worker_requests_total",
                  {{"phase", "prefill"}, {"status", "ok"}}),
            1);
  EXPECT_EQ(Value("baton_worker_requests_total",
                  {{"phase", "decode"}, {"status", "not_found"}}),
            1);
}

TEST_F(WorkerMetricsTest, KvTransfersByDirection) {
  metrics_.OnKvSent(1000, 0.002);
  metrics_.OnKvSent(500, 0.5);
  metrics_.OnKvReceived(300, 0.02);
  EXPECT_EQ(
      Value("baton_worker_kv_transfer_bytes_total", {{"direction", "sent"}}),
      1500);
  EXPECT_EQ(Value("baton_worker_kv_transfer_bytes_total",
                  {{"direction", "received"}}),
            300);
  EXPECT_EQ(
      Value("baton_worker_kv_transfer_seconds_count", {{"direction", "sent"}}),
      2);
  EXPECT_DOUBLE_EQ(
      Value("baton_worker_kv_transfer_seconds_sum", {{"direction", "sent"}}),
      0.502);
  EXPECT_EQ(Value("baton_worker_kv_transfer_seconds_bucket",
                  {{"direction", "sent"}, {"le", "0.0025"}}),
            1);
  EXPECT_EQ(Value("baton_worker_kv_transfer_seconds_count",
                  {{"direction", "received"}}),
            1);
}

TEST_F(WorkerMetricsTest, RefreshSetsGaugesAndTokenRate) {
  EngineStats stats;
  stats.num_waiting = 3;
  stats.num_running = 5;
  stats.num_handoffs = 1;
  stats.num_imports = 2;
  stats.kv_blocks_total = 64;
  stats.kv_blocks_free = 60;
  const auto t0 =
      std::chrono::steady_clock::time_point() + std::chrono::seconds(1000);
  metrics_.Refresh(stats, 123, t0);
  EXPECT_EQ(Value("baton_worker_queued_requests"), 3);
  EXPECT_EQ(Value("baton_worker_queued_prefill_tokens"), 123);
  EXPECT_EQ(Value("baton_worker_running_requests"), 5);
  EXPECT_EQ(Value("baton_worker_kv_blocks_used"), 4);
  EXPECT_EQ(Value("baton_worker_kv_blocks_free"), 60);
  EXPECT_EQ(Value("baton_worker_kv_transfers_active"), 3);
  EXPECT_EQ(Value("baton_worker_decode_tokens_per_second"), 0);

  metrics_.OnDecodeTokens(50);
  // Under a second later: the rate window is still open.
  metrics_.Refresh(stats, 0, t0 + std::chrono::milliseconds(500));
  EXPECT_EQ(Value("baton_worker_decode_tokens_per_second"), 0);
  EXPECT_EQ(Value("baton_worker_queued_prefill_tokens"), 0);
  metrics_.Refresh(stats, 0, t0 + std::chrono::seconds(2));
  EXPECT_EQ(Value("baton_worker_decode_tokens_per_second"), 25);
  metrics_.OnDecodeTokens(10);
  metrics_.Refresh(stats, 0, t0 + std::chrono::seconds(7));
  EXPECT_EQ(Value("baton_worker_decode_tokens_per_second"), 2);
}

TEST_F(WorkerMetricsTest, EverySeriesHasHelpAndTheRoleLabel) {
  metrics_.OnRequestEnded("decode", "stop");
  const std::string text = RenderText(registry_);
  auto samples = metrics::ParseExposition(text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_GE(samples->size(), 14u);
  for (const metrics::Sample& s : *samples) {
    EXPECT_EQ(s.labels.count("role"), 1u) << s.name;
    EXPECT_EQ(s.name.rfind("baton_worker_", 0), 0u) << s.name;
  }
  for (const char* name :
       {"baton_worker_queued_requests", "baton_worker_kv_transfer_seconds",
        "baton_worker_decode_tokens_total", "baton_worker_requests_total"}) {
    EXPECT_NE(text.find(std::string("# HELP ") + name + " "), std::string::npos)
        << name;
  }
}

TEST_F(WorkerMetricsTest, SameRoleSharesSeriesOtherRoleDoesNot) {
  WorkerMetrics again(registry_, "decode");
  WorkerMetrics prefill(registry_, "prefill");
  metrics_.OnDecodeTokens(1);
  again.OnDecodeTokens(2);
  prefill.OnDecodeTokens(4);
  EXPECT_EQ(Value("baton_worker_decode_tokens_total"), 3);
  EXPECT_EQ(
      FindSample(RenderText(registry_), "baton_worker_decode_tokens_total",
                 {{"role", "prefill"}})
          .value(),
      4);
}

TEST(WorkerMetricsLabelsTest, Labels) {
  EXPECT_EQ(WorkerRoleLabel(v1::WORKER_ROLE_PREFILL), "prefill");
  EXPECT_EQ(WorkerRoleLabel(v1::WORKER_ROLE_DECODE), "decode");
  EXPECT_EQ(WorkerRoleLabel(v1::WORKER_ROLE_BOTH), "both");
  EXPECT_EQ(EndStatusLabel(FinishReason::kStop, absl::OkStatus()), "stop");
  EXPECT_EQ(EndStatusLabel(FinishReason::kLength, absl::OkStatus()), "length");
  EXPECT_EQ(EndStatusLabel(FinishReason::kCancelled, absl::OkStatus()),
            "cancelled");
  EXPECT_EQ(EndStatusLabel(FinishReason::kError,
                           absl::ResourceExhaustedError("full")),
            "resource_exhausted");
  EXPECT_EQ(EndStatusLabel(FinishReason::kError, absl::OkStatus()), "unknown");
}

}  // namespace
}  // namespace baton
