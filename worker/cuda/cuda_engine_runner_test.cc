// The Engine on a CUDA device (baton-worker --device=cuda:N): a clean error
// without a device, and on a device: generation, a prefill/decode split
// through host staging with the same tokens as a colocated run, and an
// out-of-memory KV pool as ResourceExhausted.
#include "worker/cuda/cuda_engine_runner.h"

#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "worker/engine/disaggregation_test_util.h"

namespace baton {
namespace {

using namespace ::baton::disagg_test;  // NOLINT(build/namespaces): fixtures
using ::testing::HasSubstr;

ForwardRunnerFactory Cuda0() { return MakeCudaRunnerFactory({}); }

TEST_F(DisaggregationTest, WithoutADeviceTheEngineRefusesNamingTheError) {
  if (cuda_test::CudaUnavailableReason().empty()) {
    GTEST_SKIP() << "a CUDA device is present; this checks the error path "
                    "of machines without one";
  }
  EngineOptions options;
  options.kv_cache_blocks = 64;
  options.make_runner = Cuda0();
  auto engine = Engine::Create(options, weights_, tokenizer_);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition)
      << engine.status();
  EXPECT_THAT(engine.status().message(), HasSubstr("cuda"));
}

TEST_F(DisaggregationTest, CudaEngineGenerates) {
  BATON_SKIP_WITHOUT_CUDA();
  auto engine = MakeEngine(512, 16, 256, Cuda0());
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->device_name(), "cuda:0");
  // The KV lives on the GPU alone: no host mirror of the pool.
  EXPECT_FALSE(engine->kv_cache().has_host_storage());
  const std::vector<Case> cases = Cases();
  absl::Mutex mu;
  std::map<std::string, Outcome> results;
  for (const Case& c : cases) {
    ASSERT_TRUE(
        engine->Submit({c.id, c.prompt, c.params}, Collect(&results[c.id], &mu))
            .ok());
  }
  engine->RunUntilIdle();
  for (const Case& c : cases) {
    const Outcome& r = results.at(c.id);
    EXPECT_TRUE(r.error.ok()) << c.id << ": " << r.error;
    EXPECT_NE(r.reason, FinishReason::kError) << c.id;
    EXPECT_FALSE(r.tokens.empty()) << c.id;
  }
  EXPECT_TRUE(engine->health().ok()) << engine->health();
  ExpectAllFree(*engine);
}

// Greedy and seeded requests, colocated on one CUDA engine and split across
// two (KV staged device -> host -> TCP -> host -> device): the same shapes
// run on the same device, so the tokens agree.
TEST_F(DisaggregationTest, CudaSplitMatchesCudaColocated) {
  BATON_SKIP_WITHOUT_CUDA();
  std::vector<Case> cases = Cases();
  cases = {cases[0], cases[1], cases[6]};
  std::map<std::string, Outcome> split;
  for (const Case& c : cases) {
    // One request at a time, so every step has the colocated run's shape.
    const auto one = RunDisaggregated({c}, 512, Cuda0());
    split[c.id] = one.at(c.id);
  }
  std::map<std::string, Outcome> colocated_one;
  for (const Case& c : cases) {
    colocated_one[c.id] = RunColocated({c}, Cuda0()).at(c.id);
  }
  for (const Case& c : cases) {
    EXPECT_EQ(split.at(c.id).tokens, colocated_one.at(c.id).tokens) << c.id;
    EXPECT_EQ(split.at(c.id).text, colocated_one.at(c.id).text) << c.id;
  }
}

// Without a staging pool every transfer stages in pageable memory of its
// own: same tokens as through the pool (the test above), every area freed
// (RunDisaggregated's ExpectAllFree).
TEST_F(DisaggregationTest, CudaSplitStagesOnItsOwnWithoutAPool) {
  BATON_SKIP_WITHOUT_CUDA();
  CudaRunnerOptions no_pool;
  no_pool.host_staging_bytes = 0;
  std::vector<Case> cases = Cases();
  cases = {cases[1], cases[6]};
  for (const Case& c : cases) {
    const auto split =
        RunDisaggregated({c}, 512, MakeCudaRunnerFactory(no_pool)).at(c.id);
    const auto colocated = RunColocated({c}, Cuda0()).at(c.id);
    EXPECT_EQ(split.tokens, colocated.tokens) << c.id;
  }
}

TEST_F(DisaggregationTest, KvPoolBeyondDeviceMemoryIsResourceExhausted) {
  BATON_SKIP_WITHOUT_CUDA();
  EngineOptions options;
  // 4 TiB of KV: more than any GPU (and host) holds.
  options.kv_cache_bytes = uint64_t{4} << 40;
  options.make_runner = Cuda0();
  auto engine = Engine::Create(options, weights_, tokenizer_);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kResourceExhausted)
      << engine.status();
}

}  // namespace
}  // namespace baton
