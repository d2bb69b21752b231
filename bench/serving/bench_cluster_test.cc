// baton-bench against a real cluster of processes (two colocated workers
// with the default model): every request completes with exactly the
// requested number of tokens.
#include <sstream>

#include "absl/time/time.h"
#include "bench/serving/bench.h"
#include "gtest/gtest.h"
#include "tests/cluster/local_cluster.h"

namespace baton::bench {
namespace {

TEST(BenchClusterTest, RandomWorkloadCompletesWithExactLengths) {
  baton::testing::LocalClusterOptions cluster_options;
  cluster_options.prefill = 0;
  cluster_options.decode = 0;
  cluster_options.both = 2;
  auto cluster = baton::testing::LocalCluster::Start(cluster_options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  BenchOptions o;
  o.server = (*cluster)->address();
  o.random.num_prompts = 8;
  o.random.input_len = 24;
  o.random.output_len = 8;
  o.random.range_ratio = 0.5;
  o.runner.max_concurrency = 4;
  o.runner.request_timeout_s = 120;
  o.runner.seed = 42;
  std::ostringstream out, err;
  auto outcome = RunBench(o, out, err);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  std::printf("%s", out.str().c_str());
  EXPECT_EQ(OutcomeProblem(*outcome), "");
  EXPECT_EQ(outcome->metrics.completed, 8);
  for (const RequestRecord& r : outcome->run.records) {
    EXPECT_TRUE(r.success) << r.request_id << ": " << r.error_message;
    EXPECT_EQ(r.output_tokens, r.expected_output_len) << r.request_id;
    EXPECT_EQ(r.prompt_tokens, r.input_len) << r.request_id;
    EXPECT_EQ(r.finish_reason, "length") << r.request_id;
    EXPECT_GT(r.ttft_ms, 0);
    EXPECT_GE(r.e2el_ms, r.ttft_ms);
    EXPECT_FALSE(r.decode_worker.empty());
  }
  EXPECT_EQ(outcome->metrics.output_len_mismatches, 0);
  EXPECT_TRUE((*cluster)->WaitAllFree(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace baton::bench
