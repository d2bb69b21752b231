#include "bench/serving/metrics.h"

#include <vector>

#include "gtest/gtest.h"

namespace baton::bench {
namespace {

RequestRecord Ok(int index, double send_s, double ttft, double e2el, int tokens,
                 std::vector<double> itl) {
  RequestRecord r;
  r.index = index;
  r.sent = true;
  r.success = true;
  r.send_time_s = send_s;
  r.end_time_s = send_s + e2el / 1000;
  r.prompt_tokens = 10;
  r.expected_output_len = tokens;
  r.output_tokens = tokens;
  r.ttft_ms = ttft;
  r.e2el_ms = e2el;
  r.itl_ms = std::move(itl);
  return r;
}

TEST(BenchSloTest, ParsesSpacesAndCommas) {
  auto slo = ParseSlo("ttft:500 tpot:50,e2el:2000.5");
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(*slo->ttft_ms, 500);
  EXPECT_EQ(*slo->tpot_ms, 50);
  EXPECT_EQ(*slo->e2el_ms, 2000.5);
  EXPECT_TRUE(ParseSlo("")->empty());
}

TEST(BenchSloTest, RejectsUnknownMetricsAndBadValues) {
  absl::Status s = ParseSlo("ttft:500 itl:20").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown metric 'itl'"), absl::string_view::npos)
      << s;
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "ttft:0", "ttft:abc",
                          "ttft:inf", "ttft:1 ttft:2"}) {
    EXPECT_EQ(ParseSlo(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(BenchPercentilesTest, ParsesSortsAndRejects) {
  auto p = ParsePercentiles("99.9, 50,95,50");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<double>{50, 95, 99.9}));
  EXPECT_FALSE(ParsePercentiles("0").ok());
  EXPECT_FALSE(ParsePercentiles("101").ok());
  EXPECT_FALSE(ParsePercentiles("x").ok());
}

TEST(BenchSummarizeTest, InterpolatesLikeNumpy) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  const Distribution d = Summarize(v, {90, 99});
  EXPECT_EQ(d.count, 100u);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.median, 50.5);
  EXPECT_DOUBLE_EQ(d.percentiles[0].second, 90.1);
  EXPECT_DOUBLE_EQ(d.percentiles[1].second, 99.01);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 100);
  const Distribution empty = Summarize({}, {90});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.percentiles.size(), 1u);
}

TEST(BenchMetricsTest, LatenciesThroughputGoodputAndErrors) {
  std::vector<RequestRecord> records;
  // TTFT 100, 4 tokens over 400 ms: TPOT (400 - 100) / 3 = 100.
  records.push_back(Ok(0, 0.0, 100, 400, 4, {100, 100, 100}));
  // TTFT 300, TPOT (900 - 300) / 3 = 200.
  records.push_back(Ok(1, 0.5, 300, 900, 4, {150, 250, 200}));
  // One token: no TPOT, no ITL.
  records.push_back(Ok(2, 1.0, 50, 50, 1, {}));
  records.back().expected_output_len = 2;
  RequestRecord failed;
  failed.index = 3;
  failed.sent = true;
  failed.send_time_s = 1.5;
  failed.end_time_s = 1.6;
  failed.error_code = absl::StatusCode::kUnavailable;
  records.push_back(failed);
  failed.index = 4;
  failed.error_code = absl::StatusCode::kResourceExhausted;
  records.push_back(failed);
  RequestRecord aborted = failed;
  aborted.index = 5;
  aborted.aborted = true;
  records.push_back(aborted);
  RequestRecord unsent;
  unsent.index = 6;
  records.push_back(unsent);

  SloSpec slo;
  slo.ttft_ms = 200;
  slo.tpot_ms = 150;
  const BenchMetrics m = ComputeMetrics(records, slo, {90, 99});
  EXPECT_EQ(m.num_requests, 7);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.aborted, 1);
  EXPECT_EQ(m.not_sent, 1);
  EXPECT_EQ(m.errors_by_code.at("UNAVAILABLE"), 1);
  EXPECT_EQ(m.errors_by_code.at("RESOURCE_EXHAUSTED"), 1);
  // Refused before any token: shed at admission, 100 ms after its send.
  EXPECT_EQ(m.refused, 1);
  EXPECT_EQ(m.refusal_ms.count, 1u);
  EXPECT_NEAR(m.refusal_ms.max, 100, 1e-9);
  EXPECT_EQ(m.output_len_mismatches, 1);
  EXPECT_EQ(m.total_input_tokens, 30);
  EXPECT_EQ(m.total_output_tokens, 9);
  // First send 0.0, last end 1.6 (the failed ones end last).
  EXPECT_DOUBLE_EQ(m.duration_s, 1.6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 3 / 1.6);
  EXPECT_DOUBLE_EQ(m.output_throughput, 9 / 1.6);
  EXPECT_DOUBLE_EQ(m.ttft_ms.mean, 150);
  EXPECT_EQ(m.tpot_ms.count, 2u);
  EXPECT_DOUBLE_EQ(m.tpot_ms.mean, 150);
  EXPECT_EQ(m.itl_ms.count, 6u);
  EXPECT_DOUBLE_EQ(m.itl_ms.mean, 150);
  EXPECT_DOUBLE_EQ(m.e2el_ms.median, 400);
  // Request 0 meets both; 1 misses TTFT; 2 has no TPOT and meets TTFT.
  EXPECT_TRUE(m.has_goodput);
  EXPECT_EQ(m.good_requests, 2);
  EXPECT_DOUBLE_EQ(m.request_goodput, 2 / 1.6);
}

}  // namespace
}  // namespace baton::bench
