#include "bench/sim/planner.h"

#include "bench/sim/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::sim {
namespace {

using ::testing::HasSubstr;

// Prefill costs 1.3 ms per token; a decode step 3 ms + 1.7 ms per sequence
// (the example CPU profile's shape).
WorkerProfile CpuLike() {
  WorkerProfile p;
  p.prefill.c1 = 1.3e-3;
  p.decode.c0 = 0.003;
  p.decode.c2 = 0.0017;
  p.transfer_bytes_per_s = 1.5e9;
  p.kv_bytes_per_token = 23040;
  p.kv_blocks = 4096;
  return p;
}

PlanOptions Options(int workers, double rate, int in, int out,
                    const std::string& slo) {
  PlanOptions o;
  o.workers = workers;
  o.base.profile = CpuLike();
  WorkloadOptions w;
  w.num_prompts = 300;
  w.request_rate = rate;
  w.input_len = in;
  w.output_len = out;
  w.seed = 1;
  auto requests = MakeWorkload(w);
  EXPECT_TRUE(requests.ok()) << requests.status();
  o.requests = *requests;
  auto parsed = bench::ParseSlo(slo);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  o.slo = *parsed;
  return o;
}

TEST(PlannerTest, EveryShapeOfTheBudgetIsRankedByGoodput) {
  auto plan = MakePlan(Options(4, 1.0, 256, 64, "ttft:3000 tpot:100"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> shapes;
  for (const PlanRow& r : plan->rows) shapes.push_back(r.shape);
  EXPECT_THAT(shapes,
              ::testing::UnorderedElementsAre("4C", "1P3D", "2P2D", "3P1D"));
  for (size_t i = 1; i < plan->rows.size(); ++i) {
    EXPECT_GE(plan->rows[i - 1].goodput, plan->rows[i].goodput);
  }
  ASSERT_EQ(plan->at_80_percent.size(), 2u);
  ASSERT_EQ(plan->at_120_percent.size(), 2u);
  const std::string text = FormatPlan(*plan, Options(4, 1, 1, 1, "ttft:1").slo);
  EXPECT_THAT(text, HasSubstr("recommended: " + plan->rows[0].shape));
}

// A colocated worker's decode steps also carry other requests' prompts, so
// a strict bound on time per output token favours splitting the phases;
// a lenient one favours using both workers for everything.
TEST(PlannerTest, AStrictTpotFavoursSplittingThePhases) {
  auto lenient = MakePlan(Options(2, 0.5, 512, 32, "ttft:2500 tpot:50"));
  auto strict = MakePlan(Options(2, 0.5, 512, 32, "ttft:2500 tpot:20"));
  ASSERT_TRUE(lenient.ok() && strict.ok());
  EXPECT_EQ(lenient->rows[0].shape, "2C");
  EXPECT_EQ(strict->rows[0].shape, "1P1D");
}

TEST(PlannerTest, NeedsABudgetSlosAndRequests) {
  PlanOptions o = Options(2, 1, 16, 4, "ttft:100");
  o.workers = 0;
  EXPECT_THAT(MakePlan(o).status().message(), HasSubstr("budget"));
  o = Options(2, 1, 16, 4, "ttft:100");
  o.slo = bench::SloSpec();
  EXPECT_THAT(MakePlan(o).status().message(), HasSubstr("--goodput"));
  o = Options(2, 1, 16, 4, "ttft:100");
  o.requests.clear();
  EXPECT_THAT(MakePlan(o).status().message(), HasSubstr("no requests"));
}

}  // namespace
}  // namespace baton::sim
