// baton-bench against a real cluster of processes (two colocated workers
// with the default model): every request completes with exactly the
// requested number of tokens, and a rerun finds its prompts cached unless it
// resets the caches; the multi-turn workload hits the prefix cache.
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "bench/serving/bench.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/local_cluster.h"

namespace baton::bench {
namespace {

// A cluster of `both` colocated workers.
absl::StatusOr<std::unique_ptr<baton::testing::LocalCluster>> StartColocated(
    int both) {
  baton::testing::LocalClusterOptions options;
  options.prefill = 0;
  options.decode = 0;
  options.both = both;
  return baton::testing::LocalCluster::Start(options);
}

TEST(BenchClusterTest, RandomWorkloadCompletesWithExactLengths) {
  auto cluster = StartColocated(2);
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

  // The same seeded prompts again find their blocks in the prefix cache
  // (prompts of 17 tokens or more have a full block before their last);
  // after --reset_prefix_cache none does.
  auto cached = [](const BenchOutcome& o) {
    int hits = 0;
    for (const RequestRecord& r : o.run.records) hits += r.cached_tokens > 0;
    return hits;
  };
  auto again = RunBench(o, out, err);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(cached(*again), 0);
  o.reset_prefix_cache = true;
  auto cold = RunBench(o, out, err);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(cold->metrics.completed, 8);
  EXPECT_EQ(cached(*cold), 0);
  EXPECT_NE(err.str().find("prefix caches reset: 2 workers"), std::string::npos)
      << err.str();
  EXPECT_TRUE((*cluster)->WaitAllFree(absl::Seconds(10)).ok());
}

// Conversations resending their history to one colocated worker: every
// later turn reuses at least the shared system prompt's full blocks, and
// the result file lists every turn.
TEST(BenchClusterTest, MultiTurnLaterTurnsHitThePrefixCache) {
  auto cluster = StartColocated(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  BenchOptions o;
  o.server = (*cluster)->address();
  o.dataset_name = "multiturn";
  o.multiturn.conversations = 3;
  o.multiturn.turns = 3;
  o.multiturn.system_len = 40;
  o.multiturn.user_len = 8;
  o.random.output_len = 4;
  o.runner.max_concurrency = 2;
  o.runner.request_timeout_s = 120;
  o.save_result = true;
  o.result_dir = ::testing::TempDir();
  o.result_filename = "multiturn.json";
  std::ostringstream out, err;
  auto outcome = RunBench(o, out, err);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  std::printf("%s", out.str().c_str());
  EXPECT_EQ(OutcomeProblem(*outcome), "");
  EXPECT_EQ(OutcomeExitCode(*outcome), 0);
  std::ifstream file(outcome->result_path);
  const nlohmann::json result = nlohmann::json::parse(file, nullptr, false);
  ASSERT_FALSE(result.is_discarded());
  ASSERT_EQ(result["turns"].size(), 9u);
  for (const nlohmann::json& t : result["turns"]) {
    SCOPED_TRACE(t.dump());
    EXPECT_TRUE(t["ok"].get<bool>());
    EXPECT_EQ(t["completion_tokens"], 4);
    const int turn = t["turn"].get<int>();
    // Prompt: system + turn x (user) + (turn - 1) x (answer).
    EXPECT_EQ(t["prompt_tokens"], 40 + turn * 8 + (turn - 1) * 4);
    if (turn > 1) {
      EXPECT_GE(t["cached_tokens"].get<int>(), 32);
    }
  }
  EXPECT_GT(
      result["summary"]["later_turns"]["cached_tokens_mean"].get<double>(), 32);
  EXPECT_TRUE((*cluster)->WaitAllFree(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace baton::bench
