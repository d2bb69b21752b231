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
      Simulate(options, std::vector<SimRequest>(16, {0, 32, 384}));
  auto burst = Simulate(options, std::vector<SimRequest>(16, {0, 256, 64}));
  ASSERT_TRUE(prompts_alone.ok() && decoding_alone.ok() && burst.ok());
  NeighborBaseline baseline;
  int steps = 0;
  auto prefill =
      PrefillBurstRatio(prompts_alone->records, CpuLikeProfile(), &steps);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  baseline.prefill_ratio = *prefill;
  baseline.decode_ratio = DecodeRatio(
      DecodeWindowSamples(decoding_alone->records, 64), CpuLikeProfile());
  EXPECT_NEAR(baseline.prefill_ratio, 1.1, 0.01);
  EXPECT_NEAR(baseline.decode_ratio, 1.1, 0.02);

  auto drifted = EstimateNeighborSlowdown(burst->records, CpuLikeProfile());
  ASSERT_TRUE(drifted.ok()) << drifted.status();
  EXPECT_GT(drifted->slowdown.decode, 0.3) << drifted->Describe();
  auto e = EstimateNeighborSlowdown(burst->records, CpuLikeProfile(), baseline);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->slowdown.prefill, 0.05, 0.01) << e->Describe();
  EXPECT_NEAR(e->slowdown.decode, 0.25, 0.02) << e->Describe();
}

// Three runs, one of them off (a host that stalled during it): the
// median of each figure is the middle run's, field by field, and the steps
// timed add up.
TEST(NeighborsTest, TheMedianOfSeveralRunsLeavesAnOutlierOut) {
  const auto run = [](double decode, double prefill, double base_decode,
                      double base_prefill) {
    NeighborEstimate e;
    e.slowdown = {.prefill = prefill, .decode = decode};
    e.baseline = {.prefill_ratio = base_prefill, .decode_ratio = base_decode};
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
  EXPECT_DOUBLE_EQ(m.baseline.decode_ratio, 1.02);
  EXPECT_DOUBLE_EQ(m.baseline.prefill_ratio, 1.01);
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
