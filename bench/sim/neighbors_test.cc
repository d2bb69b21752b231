#include "bench/sim/neighbors.h"

#include "bench/sim/profiler.h"
#include "bench/sim/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::sim {
namespace {

using ::testing::HasSubstr;

// A profile shaped like a one-thread CPU worker's (bench/sim/profiles).
WorkerProfile CpuLikeProfile() {
  WorkerProfile p;
  p.prefill = {0.025, 0.0025, 8e-7};
  p.decode = {0.0037, 4.3e-6, 0.0029};
  p.transfer_alpha_s = 0.001;
  p.transfer_bytes_per_s = 1e10;
  p.kv_bytes_per_token = 23040;
  p.kv_blocks = 728;
  p.block_size = 16;
  p.max_batch_tokens = 512;
  p.max_num_seqs = 64;
  return p;
}

TEST(NeighborsTest, RecoversTheSimulatorsSlowdownsFromABurst) {
  // The profiler's burst, run by baton-sim on a 1P1D cluster whose two
  // workers share a host and slow each other down by known fractions:
  // the estimate, against the same fits, finds those fractions again.
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = CpuLikeProfile();
  options.profile.neighbor_slowdown = {.prefill = 0.05, .decode = 0.25};
  options.workers_per_host = 2;
  auto run = Simulate(options, std::vector<SimRequest>(16, {0, 256, 64}));
  ASSERT_TRUE(run.ok()) << run.status();
  auto e = EstimateNeighborSlowdown(run->records, CpuLikeProfile());
  ASSERT_TRUE(e.ok()) << e.status();
  // The first step takes the first prompt to arrive, the next ones two
  // each (512 tokens), the last one the 16th: 8 after the first.
  EXPECT_EQ(e->prefill_steps, 8);
  EXPECT_GT(e->decode_busy, 0.3);
  EXPECT_LT(e->decode_busy, 1.0);
  EXPECT_NEAR(e->slowdown.prefill, 0.05, 0.005) << e->Describe();
  EXPECT_NEAR(e->slowdown.decode, 0.25, 0.01) << e->Describe();

  // Workers that share nothing: no slowdown.
  options.workers_per_host = 1;
  run = Simulate(options, std::vector<SimRequest>(16, {0, 256, 64}));
  ASSERT_TRUE(run.ok()) << run.status();
  e = EstimateNeighborSlowdown(run->records, CpuLikeProfile());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->slowdown.prefill, 0, 0.005) << e->Describe();
  EXPECT_NEAR(e->slowdown.decode, 0, 0.01) << e->Describe();
}

TEST(NeighborsTest, TheBaselineTakesOutTheHostsDriftSinceTheFits) {
  // The host runs 10% slower than when the fits were taken: against the
  // fits alone the burst reads that drift as neighbour slowdown; against
  // the baseline (the same steps with an idle neighbour, timed the way the
  // profiler times them) the known fractions come out again.
  WorkerProfile slower = CpuLikeProfile();
  for (CostModel* m : {&slower.prefill, &slower.decode}) {
    m->c0 *= 1.1;
    m->c1 *= 1.1;
    m->c2 *= 1.1;
  }
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = slower;
  options.profile.neighbor_slowdown = {.prefill = 0.05, .decode = 0.25};
  options.workers_per_host = 2;
  auto prompts_alone =
      Simulate(options, std::vector<SimRequest>(16, {0, 256, 1}));
  auto decoding_alone =
      Simulate(options, std::vector<SimRequest>(2, {0, 256, 128}));
  auto burst = Simulate(options, std::vector<SimRequest>(16, {0, 256, 64}));
  ASSERT_TRUE(prompts_alone.ok() && decoding_alone.ok() && burst.ok());
  NeighborBaseline baseline;
  int steps = 0;
  auto prefill =
      PrefillBurstRatio(prompts_alone->records, CpuLikeProfile(), &steps);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  baseline.prefill_ratio = *prefill;
  baseline.decode = DecodeAloneTimes(decoding_alone->records, CpuLikeProfile());
  EXPECT_NEAR(baseline.prefill_ratio, 1.1, 0.01);
  EXPECT_NEAR(baseline.decode.Ratio(), 1.1, 0.02);

  auto drifted = EstimateNeighborSlowdown(burst->records, CpuLikeProfile());
  ASSERT_TRUE(drifted.ok()) << drifted.status();
  EXPECT_GT(drifted->slowdown.decode, 0.3) << drifted->Describe();
  auto e = EstimateNeighborSlowdown(burst->records, CpuLikeProfile(), baseline);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->slowdown.prefill, 0.05, 0.01) << e->Describe();
  EXPECT_NEAR(e->slowdown.decode, 0.25, 0.02) << e->Describe();
}

// The fits miss a fixed cost of every decode step (30% of c0), which
// weighs more in a small batch than in a large one. A baseline timed batch
// by batch (the burst's tail, and three requests of its prompts with
// answers long enough to decode together) reads the fit's error at the
// batches the burst decodes and finds the known slowdown again; one of 16
// short prompts (the decode fit's largest samples) reads less of it, and
// the rest as slowdown.
TEST(NeighborsTest, TheDecodeBaselineIsTakenBatchByBatch) {
  WorkerProfile truth = CpuLikeProfile();
  truth.decode.c0 *= 1.3;
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = truth;
  options.profile.neighbor_slowdown = {.prefill = 0, .decode = 0.10};
  options.workers_per_host = 2;
  auto burst = Simulate(options, std::vector<SimRequest>(16, {0, 256, 64}));
  auto alone = Simulate(options, std::vector<SimRequest>(3, {0, 256, 192}));
  auto largest = Simulate(options, std::vector<SimRequest>(16, {0, 32, 384}));
  ASSERT_TRUE(burst.ok() && alone.ok() && largest.ok());

  NeighborBaseline baseline;
  baseline.decode = DecodeAloneTimes(burst->records, CpuLikeProfile());
  baseline.decode.Add(DecodeAloneTimes(alone->records, CpuLikeProfile()));
  for (int64_t batch : {1, 2, 3}) {
    EXPECT_GE(baseline.decode.by_batch[batch].gaps, DecodeTimes::kMinGaps)
        << batch;
  }
  EXPECT_GT(baseline.decode.RatioAt(1), baseline.decode.RatioAt(3));
  auto e = EstimateNeighborSlowdown(burst->records, CpuLikeProfile(), baseline);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->decode_batch, 1);
  EXPECT_LT(e->decode_batch, 3);
  EXPECT_NEAR(e->slowdown.decode, 0.10, 0.01) << e->Describe();

  NeighborBaseline at_16;
  at_16.decode = DecodeAloneTimes(largest->records, CpuLikeProfile());
  // It decodes at 16, and at 15 once the first request ends (its prompt
  // was prefilled alone): a batch of 1 falls back to the nearer.
  EXPECT_EQ(at_16.decode.gaps(),
            at_16.decode.by_batch[15].gaps + at_16.decode.by_batch[16].gaps);
  EXPECT_DOUBLE_EQ(at_16.decode.RatioAt(1), at_16.decode.RatioAt(15));
  e = EstimateNeighborSlowdown(burst->records, CpuLikeProfile(), at_16);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->slowdown.decode, 0.15) << e->Describe();
}

// Three runs, one of them off (a host that stalled during it): the
// median of each figure is the middle run's, field by field, and the steps
// timed add up.
TEST(NeighborsTest, TheMedianOfSeveralRunsLeavesAnOutlierOut) {
  const auto run = [](double decode, double prefill, double base_decode,
                      double base_prefill) {
    NeighborEstimate e;
    e.slowdown = {.prefill = prefill, .decode = decode};
    e.prefill_alone = base_prefill;
    e.decode_alone = base_decode;
    e.decode_level = base_decode + 0.05;
    e.prefill_ratio = 1 + prefill;
    e.decode_ratio = 1 + decode;
    e.decode_busy = 0.5;
    e.prefill_steps = 8;
    e.decode_steps = 100;
    return e;
  };
  const NeighborEstimate m = MedianNeighborEstimate(
      {run(0.12, 0.00, 1.02, 0.99), run(0.005, 0.09, 1.10, 1.01),
       run(0.27, 0.04, 0.97, 1.05)});
  EXPECT_DOUBLE_EQ(m.slowdown.decode, 0.12);
  EXPECT_DOUBLE_EQ(m.slowdown.prefill, 0.04);
  EXPECT_DOUBLE_EQ(m.decode_alone, 1.02);
  EXPECT_DOUBLE_EQ(m.decode_level, 1.07);
  EXPECT_DOUBLE_EQ(m.prefill_alone, 1.01);
  EXPECT_DOUBLE_EQ(m.decode_ratio, 1.12);
  EXPECT_DOUBLE_EQ(m.prefill_ratio, 1.04);
  EXPECT_DOUBLE_EQ(m.decode_busy, 0.5);
  EXPECT_EQ(m.prefill_steps, 24);
  EXPECT_EQ(m.decode_steps, 300);
  // One run is its own median.
  EXPECT_DOUBLE_EQ(
      MedianNeighborEstimate({run(0.2, 0.1, 1, 1)}).slowdown.decode, 0.2);
}

TEST(NeighborsTest, TooSmallABurstIsAnError) {
  SimOptions options;
  ASSERT_TRUE(ParseShape("1P1D", &options).ok());
  options.profile = CpuLikeProfile();
  // Two steps: the first prompt, then the other two.
  auto run = Simulate(options, std::vector<SimRequest>(3, {0, 256, 64}));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(EstimateNeighborSlowdown(run->records, CpuLikeProfile())
                  .status()
                  .message(),
              HasSubstr("fewer than 3 prefill steps"));
}

}  // namespace
}  // namespace baton::sim
