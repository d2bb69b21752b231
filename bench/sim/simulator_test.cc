#include "bench/sim/simulator.h"

#include <cmath>
#include <numeric>

#include "bench/serving/arrivals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::sim {
namespace {

using ::testing::HasSubstr;

// Prefill takes `prefill_s` per prompt (one prompt of `len` tokens per
// step), decode `step_s` per step whatever the batch.
WorkerProfile FixedProfile(double prefill_s, double step_s, int64_t len) {
  WorkerProfile p;
  p.prefill.c0 = prefill_s;
  p.decode.c0 = step_s;
  p.transfer_alpha_s = 0;
  p.transfer_bytes_per_s = 1e12;
  p.kv_bytes_per_token = 1000;
  p.kv_blocks = 1 << 16;
  p.block_size = 16;
  p.max_batch_tokens = len;
  p.max_num_seqs = 256;
  return p;
}

std::vector<SimRequest> Poisson(int n, double rate, int64_t in, int64_t out,
                                uint64_t seed) {
  bench::ArrivalOptions arrivals;
  arrivals.request_rate = rate;
  auto offsets = bench::ArrivalOffsets(n, arrivals, seed);
  EXPECT_TRUE(offsets.ok()) << offsets.status();
  std::vector<SimRequest> requests;
  for (double t : *offsets) requests.push_back({t, in, out});
  return requests;
}

double MeanTtftMs(const SimResult& result) {
  double sum = 0;
  for (const bench::RequestRecord& r : result.records) sum += r.ttft_ms;
  return sum / static_cast<double>(result.records.size());
}

// One prefill worker with a deterministic service time D and Poisson
// arrivals is an M/D/1 queue: the mean wait is rho D / (2 (1 - rho))
// (Pollaczek-Khinchine), and the first token comes after wait + D.
TEST(SimulatorTest, OnePrefillWorkerIsAnMD1Queue) {
  const double service_s = 0.1;
  for (double rho : {0.5, 0.8}) {
    SimOptions options;
    options.profile = FixedProfile(service_s, 0.01, 64);
    const auto requests = Poisson(100000, rho / service_s, 64, 1, 7);
    auto result = Simulate(options, requests);
    ASSERT_TRUE(result.ok()) << result.status();
    const double expected_ms =
        1e3 * (service_s + rho * service_s / (2 * (1 - rho)));
    const double got_ms = MeanTtftMs(*result);
    EXPECT_NEAR(got_ms / expected_ms, 1.0, 0.05)
        << "rho " << rho << ": simulated mean TTFT " << got_ms
        << " ms, M/D/1 gives " << expected_ms << " ms";
  }
}

TEST(SimulatorTest, SaturatedThroughputIsTheSlowerPoolsRate) {
  // Everything arrives at once: 2 prefill workers at 10 prompts/s each,
  // one decode worker whose steps take 12.5 ms per sequence in the batch,
  // 10 steps per request (20 requests/s at most... 1 / 0.125 s = 8/s
  // whatever the batch): decode bounds it.
  SimOptions options;
  ASSERT_TRUE(ParseShape("2P1D", &options).ok());
  options.profile = FixedProfile(0.1, 0, 64);
  options.profile.decode.c2 = 0.0125;
  std::vector<SimRequest> requests(400, SimRequest{0, 64, 11});
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  const double throughput = 400 / result->end_s;
  EXPECT_NEAR(throughput / 8.0, 1.0, 0.05) << throughput << " requests/s";
  for (const auto& r : result->records) {
    ASSERT_TRUE(r.success);
    EXPECT_EQ(r.output_tokens, 11);
    EXPECT_EQ(r.itl_ms.size(), 10u);
  }
}

TEST(SimulatorTest, ALongPromptIsChunkedBesideTheRunningDecodes) {
  // One colocated worker, 1 ms a prompt token, 1 ms a decode step, 512
  // tokens a step: a 2,000-token prompt arriving while a short request
  // decodes is prefilled in four chunks with one decode token in each step,
  // as the engine's scheduler does, not in one 2-second step.
  SimOptions options;
  ASSERT_TRUE(ParseShape("1C", &options).ok());
  options.profile = FixedProfile(0, 0.001, 512);
  options.profile.prefill.c1 = 0.001;
  const std::vector<SimRequest> requests = {SimRequest{0, 16, 10},
                                            SimRequest{0.001, 2000, 1}};
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  const bench::RequestRecord& short_one = result->records[0];
  const bench::RequestRecord& long_one = result->records[1];
  ASSERT_EQ(short_one.itl_ms.size(), 9u);
  for (double gap : short_one.itl_ms) EXPECT_LT(gap, 520);
  // After the short prompt's 16 ms step: 511 + 511 + 511 + 467 tokens, each
  // step with one decode token beside them (1 ms).
  EXPECT_NEAR(long_one.ttft_ms, 16 + 2000 + 4 - 1, 1e-6);
}

TEST(SimulatorTest, WorkersOfOneHostSlowEachOtherDown) {
  // Two colocated workers, saturated: every step starts while the other
  // computes (but the very first), so with a 10% neighbour slowdown of
  // prefills the run of one-token answers (prefills only: the decode
  // fraction has nothing to slow) takes 10% longer when they share a host,
  // and as long as without it when they do not.
  SimOptions options;
  ASSERT_TRUE(ParseShape("2C", &options).ok());
  options.profile = FixedProfile(0.1, 0.05, 64);
  options.profile.neighbor_slowdown = {.prefill = 0.1, .decode = 0.5};
  std::vector<SimRequest> requests(400, SimRequest{0, 64, 1});
  auto apart = Simulate(options, requests);
  options.workers_per_host = 2;
  auto shared = Simulate(options, requests);
  ASSERT_TRUE(apart.ok() && shared.ok());
  EXPECT_NEAR(apart->end_s, 400 / 2 * 0.1, 1e-9);
  EXPECT_NEAR(shared->end_s / apart->end_s, 1.1, 0.005);
  options.workers_per_host = 0;
  EXPECT_THAT(Simulate(options, requests).status().message(),
              HasSubstr("workers_per_host must be >= 1"));
}

TEST(SimulatorTest, SameInputsGiveTheSameRun) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("3P2D", &options).ok());
  options.profile = FixedProfile(0.02, 0.01, 512);
  options.profile.prefill.c1 = 1e-4;
  options.profile.decode.c1 = 1e-6;
  options.profile.kv_blocks = 64;  // reservations wait in lines
  std::vector<SimRequest> requests = Poisson(2000, 40, 100, 30, 3);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].input_len = 20 + static_cast<int64_t>(i * 37 % 300);
  }
  auto a = Simulate(options, requests);
  auto b = Simulate(options, requests);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->records.size(), b->records.size());
  int lined = 0;
  for (size_t i = 0; i < a->records.size(); ++i) {
    const auto& x = a->records[i];
    const auto& y = b->records[i];
    ASSERT_TRUE(x.success) << i;
    EXPECT_EQ(x.prefill_worker, y.prefill_worker);
    EXPECT_EQ(x.decode_worker, y.decode_worker);
    EXPECT_EQ(x.ttft_ms, y.ttft_ms);
    EXPECT_EQ(x.itl_ms, y.itl_ms);
    if (x.ttft_ms > 1000) ++lined;
  }
  EXPECT_GT(lined, 0) << "the KV pools never filled";
}

TEST(SimulatorTest, ColocatedWorkersWaitForKvRoom) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("2C", &options).ok());
  options.profile = FixedProfile(0.01, 0.01, 256);
  options.profile.kv_blocks = 20;  // 320 tokens: two requests at a time
  std::vector<SimRequest> requests(50, SimRequest{0, 100, 50});
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const auto& r : result->records) {
    ASSERT_TRUE(r.success);
    EXPECT_EQ(r.output_tokens, 50);
    EXPECT_EQ(r.prefill_worker, r.decode_worker);
  }
  // 25 requests per worker, at most two at a time, each holding its slot
  // for at least a 0.01 s prefill and 49 decode steps of 0.01 s: at least
  // 13 rounds of 0.5 s, and fewer than one request at a time would take.
  EXPECT_GE(result->end_s, 13 * 0.5);
  EXPECT_LT(result->end_s, 25 * 0.5);
}

TEST(SimulatorTest, AdmissionShedsOverloadOnTheMeasuredRate) {
  SimOptions options;
  options.profile = FixedProfile(0.1, 0.001, 64);
  options.profile.prefill.c0 = 0;
  options.profile.prefill.c1 = 0.1 / 64;  // 640 tokens/s
  options.admission.ttft_slo = absl::Milliseconds(500);
  const auto requests = Poisson(2000, 20, 64, 2, 5);  // 2x capacity
  auto result = Simulate(options, requests);
  ASSERT_TRUE(result.ok()) << result.status();
  int refused = 0;
  double worst_admitted_ms = 0;
  for (const auto& r : result->records) {
    if (!r.success) {
      EXPECT_EQ(r.error_code, absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(r.error_message, HasSubstr("--ttft_slo_ms"));
      EXPECT_EQ(r.end_time_s, r.send_time_s);
      ++refused;
    } else {
      worst_admitted_ms = std::max(worst_admitted_ms, r.ttft_ms);
    }
  }
  // About half is shed, and what is admitted starts within the SLO plus
  // one prompt's prefill (the estimate counts queued tokens exactly).
  EXPECT_NEAR(refused / 2000.0, 0.5, 0.1);
  EXPECT_LE(worst_admitted_ms, 500 + 100 + 1e-6);
}

TEST(SimulatorTest, RejectsBadShapesAndRequests) {
  SimOptions options;
  EXPECT_THAT(ParseShape("1X", &options).message(), HasSubstr("'X'"));
  EXPECT_THAT(ParseShape("P1", &options).message(), HasSubstr("1P1D"));
  ASSERT_TRUE(ParseShape("1P1C", &options).ok());
  options.profile = FixedProfile(0.1, 0.1, 64);
  EXPECT_FALSE(Simulate(options, {}).ok());
  ASSERT_TRUE(ParseShape("1C", &options).ok());
  EXPECT_THAT(Simulate(options, {{0, 0, 1}}).status().message(),
              HasSubstr("request 0"));
  EXPECT_THAT(Simulate(options, {{1, 4, 1}, {0, 4, 1}}).status().message(),
              HasSubstr("ascending"));
  EXPECT_THAT(Simulate(options, {{0, 1 << 20, 1 << 20}}).status().message(),
              HasSubstr("KV pool"));
  SimRequest big_id(0, 32, 4);
  big_id.piece_ids = {int64_t{1} << 48};
  EXPECT_THAT(Simulate(options, {big_id}).status().message(),
              HasSubstr("piece (hash) id 281474976710656 is outside"));
  big_id.piece_ids = {-1};
  EXPECT_THAT(Simulate(options, {big_id}).status().message(),
              HasSubstr("piece (hash) id -1"));
  options.piece_tokens = 16 * 65536;
  EXPECT_THAT(Simulate(options, {{0, 4, 1}}).status().message(),
              HasSubstr("at most 65535 blocks"));
}

TEST(ProfileTest, ParsesAndNamesTheBadField) {
  const nlohmann::json good = {
      {"name", "x"},
      {"prefill", {{"c0", 0.001}, {"c1", 1e-4}, {"c2", 0}}},
      {"decode", {{"c0", 0.002}, {"c1", 1e-7}, {"c2", 1e-4}}},
      {"transfer", {{"alpha_s", 0.0001}, {"bytes_per_s", 2e9}}},
      {"kv_bytes_per_token", 23040},
      {"kv_blocks", 4096},
      {"block_size", 16},
      {"max_batch_tokens", 512},
      {"max_num_seqs", 64}};
  auto p = ParseProfile(good);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ProfileJson(*p)["decode"]["c2"], 1e-4);
  EXPECT_DOUBLE_EQ(PrefillSeconds(*p, std::vector<int64_t>{10, 20}),
                   0.001 + 1e-4 * 30);
  EXPECT_DOUBLE_EQ(TransferSeconds(*p, 1000), 0.0001 + 23040e3 / 2e9);
  // The square term is optional (0: a link-bound transfer).
  EXPECT_EQ(p->transfer_s_per_token2, 0);
  nlohmann::json paced = good;
  paced["transfer"]["s_per_token2"] = 1e-9;
  auto q = ParseProfile(paced);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(TransferSeconds(*q, 1000),
                   0.0001 + 23040e3 / 2e9 + 1e-9 * 1e6);
  EXPECT_EQ(ProfileJson(*q)["transfer"]["s_per_token2"], 1e-9);
  // So is the neighbour slowdown (0: workers that share nothing), one
  // number for both phases or one for each.
  EXPECT_EQ(p->neighbor_slowdown.prefill, 0);
  EXPECT_EQ(p->neighbor_slowdown.decode, 0);
  paced["neighbor_slowdown"] = 0.06;
  q = ParseProfile(paced);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->neighbor_slowdown.prefill, 0.06);
  EXPECT_EQ(q->neighbor_slowdown.decode, 0.06);
  paced["neighbor_slowdown"] = {{"prefill", 0.03}, {"decode", 0.2}};
  q = ParseProfile(paced);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(ProfileJson(*q)["neighbor_slowdown"], paced["neighbor_slowdown"]);
  nlohmann::json bad = good;
  bad["neighbor_slowdown"] = -0.1;
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'neighbor_slowdown' must be >= 0"));
  bad["neighbor_slowdown"] = {{"prefill", 0.03}};
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'neighbor_slowdown.decode' is missing"));
  bad = good;
  bad["transfer"]["s_per_token2"] = -1e-9;
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'transfer.s_per_token2' must be >= 0"));
  bad = good;
  bad["prefill"]["c1"] = -1;
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'prefill.c1' must be >= 0"));
  bad = good;
  bad["transfer"]["bytes_per_s"] = 0;
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'transfer.bytes_per_s' must be > 0"));
  bad = good;
  bad.erase("kv_blocks");
  EXPECT_THAT(ParseProfile(bad).status().message(),
              HasSubstr("'kv_blocks' is missing"));
  bad = good;
  bad["block_size"] = 1.5;
  EXPECT_THAT(ParseProfile(bad).status().message(), HasSubstr("integer"));
}

// The decode fit's error by batch: a step costs the fit times the factor at
// its batch, linear between the batches listed, the end's beyond them.
TEST(ProfileTest, DecodeBatchFactorsScaleTheDecodeFit) {
  WorkerProfile p;
  p.decode = {0.002, 1e-7, 1e-4};
  p.kv_bytes_per_token = 23040;
  const double fit = 0.002 + 1e-7 * 300 + 1e-4 * 3;
  EXPECT_DOUBLE_EQ(DecodeSeconds(p, 300, 3), fit);  // none: factor 1
  nlohmann::json json = ProfileJson(p);
  EXPECT_FALSE(json.contains("decode_batch_factors"));
  json["decode_batch_factors"] = {{1, 1.04}, {2, 0.96}, {4, 0.92}, {16, 1.08}};
  auto q = ParseProfile(json);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(DecodeBatchFactor(*q, 1), 1.04);
  EXPECT_DOUBLE_EQ(DecodeBatchFactor(*q, 3), 0.94);
  EXPECT_DOUBLE_EQ(DecodeBatchFactor(*q, 10), 1.0);
  EXPECT_DOUBLE_EQ(DecodeBatchFactor(*q, 64), 1.08);
  EXPECT_DOUBLE_EQ(DecodeSeconds(*q, 300, 3), fit * 0.94);
  EXPECT_EQ(ProfileJson(*q)["decode_batch_factors"],
            json["decode_batch_factors"]);
  StepWork work;
  work.Add(99, 1);
  work.Add(199, 1);
  EXPECT_DOUBLE_EQ(work.DecodePart(*q), DecodeSeconds(p, 300, 2) * 0.96);

  for (auto [factors, error] :
       {std::pair{nlohmann::json{{2, 1.0}, {2, 1.1}}, "above 2 (ascending)"},
        std::pair{nlohmann::json{{0, 1.0}}, "above 0"},
        std::pair{nlohmann::json{{1.5, 1.0}}, "an integer"},
        std::pair{nlohmann::json{{1, 0.0}}, "in (0, 10]"},
        std::pair{nlohmann::json{{1, 11.0}}, "in (0, 10]"},
        std::pair{nlohmann::json{{1}}, "must be [batch, factor]"},
        std::pair{nlohmann::json(1.0), "a list of [batch, factor]"}}) {
    nlohmann::json bad = json;
    bad["decode_batch_factors"] = factors;
    EXPECT_THAT(ParseProfile(bad).status().message(), HasSubstr(error))
        << factors;
  }
}

// The step pricing the simulated engine and baton-sim share: prompt pieces
// on top of what the cache holds, and one token after the first as a decode
// (a prompt's one-token last chunk too), with known figures.
TEST(ProfileTest, AStepIsPricedByItsPromptPiecesAndItsDecodes) {
  WorkerProfile p;
  p.prefill = {0.001, 1e-4, 1e-8};
  p.decode = {0.002, 1e-7, 1e-4};
  StepWork none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.PrefillPart(p), 0);
  EXPECT_EQ(none.DecodePart(p), 0);
  StepWork work;
  work.Add(0, 100);  // a whole prompt
  work.Add(64, 36);  // a chunk on top of 64 tokens
  work.Add(99, 1);   // a decode feeding position 99
  work.Add(200, 1);  // a prompt's last chunk of one token: a decode
  work.Add(0, 1);    // a one-token prompt: a prompt piece
  EXPECT_FALSE(work.empty());
  EXPECT_DOUBLE_EQ(work.PrefillPart(p),
                   0.001 + 1e-4 * (100 + 36 + 1) +
                       1e-8 * (100.0 * 100 + (100.0 * 100 - 64.0 * 64) + 1));
  EXPECT_DOUBLE_EQ(work.DecodePart(p), 0.002 + 1e-7 * (100 + 201) + 1e-4 * 2);
}

}  // namespace
}  // namespace baton::sim
