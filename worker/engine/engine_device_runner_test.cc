// The engine over a device-style runner (EngineOptions::make_runner): the
// live KV outside the host cache, the handoff staged through
// CopyLayerToHost, an import staged through CopyToDevice, and a device fault
// failing its step and turning the engine unhealthy. ShadowRunner stands in
// for the device (see shadow_runner_test_util.h); the CUDA runner
// implements the same hooks.
#include <memory>
#include <utility>

#include "worker/engine/disaggregation_test_util.h"
#include "worker/engine/shadow_runner_test_util.h"

namespace baton {
namespace {

using namespace ::baton::disagg_test;  // NOLINT(build/namespaces): fixtures
using ::baton::testing::ShadowRunner;
using ::baton::testing::ShadowRunnerControl;
using ::testing::HasSubstr;

using Control = std::shared_ptr<ShadowRunnerControl>;

// The first engine created gets controls[0], the next controls[1], ...
ForwardRunnerFactory InOrder(std::vector<Control> controls) {
  auto next = std::make_shared<size_t>(0);
  return [controls, next](const ModelWeights* w, KvCache* c, ThreadPool* p) {
    const Control control = controls.at((*next)++);
    return ShadowRunner::Factory(control)(w, c, p);
  };
}

std::vector<Case> SomeCases(const std::vector<Case>& all) {
  return {all[0], all[1], all[6], all[7]};
}

TEST_F(DisaggregationTest, ShadowRunnerColocatedMatchesCpu) {
  const std::vector<Case> cases = SomeCases(Cases());
  auto control = std::make_shared<ShadowRunnerControl>();
  ExpectSame(RunColocated(cases),
             RunColocated(cases, ShadowRunner::Factory(control)));
  EXPECT_GT(control->forwards, 0);
}

// Both engines keep their KV "on the device": the handoff must stage every
// layer to the host and the import must be copied in, or tokens change.
TEST_F(DisaggregationTest, DeviceRunnersHandOffThroughHostStaging) {
  // Short and long prompts, greedy and seeded (also run under TSan: kept
  // small).
  const std::vector<Case> all = Cases();
  const std::vector<Case> cases = {all[1], all[6]};
  auto prefill = std::make_shared<ShadowRunnerControl>();
  auto decode = std::make_shared<ShadowRunnerControl>();
  const auto split = RunDisaggregated(cases, /*prefill_budget=*/512,
                                      InOrder({prefill, decode}));
  ExpectSame(RunColocated(cases), split);
  EXPECT_EQ(prefill->table_layers_copied_to_host,
            static_cast<int64_t>(cases.size()) * weights_->config().num_layers);
  EXPECT_EQ(decode->tables_copied_to_device,
            static_cast<int64_t>(cases.size()));
  // Through the staging pools, which are big enough.
  EXPECT_GT(prefill->pooled_stagings, 0);
  EXPECT_GT(decode->pooled_stagings, 0);
  EXPECT_EQ(prefill->own_stagings + decode->own_stagings, 0);
}

// No staging pool, or one of a single block: transfers stage in memory of
// their own, with the same tokens (RunDisaggregated also checks every
// staging block is back).
TEST_F(DisaggregationTest, TransfersBeyondTheStagingPoolStageOnTheirOwn) {
  const std::vector<Case> all = Cases();
  const std::vector<Case> cases = {all[1], all[6]};
  const auto colocated = RunColocated(cases);
  for (const int64_t staging_blocks : {0, 1}) {
    auto prefill = std::make_shared<ShadowRunnerControl>();
    auto decode = std::make_shared<ShadowRunnerControl>();
    prefill->staging_blocks = decode->staging_blocks = staging_blocks;
    ExpectSame(colocated,
               RunDisaggregated(cases, 512, InOrder({prefill, decode})));
    EXPECT_GT(prefill->own_stagings, 0) << staging_blocks;
    EXPECT_GT(decode->own_stagings, 0) << staging_blocks;
    if (staging_blocks == 0) {
      EXPECT_EQ(prefill->pooled_stagings + decode->pooled_stagings, 0);
    }
  }
}

TEST_F(DisaggregationTest, ChunkedPrefillStagesEveryChunksLayers) {
  std::vector<Case> cases = Cases();
  cases = {cases[6], cases[7]};
  auto prefill = std::make_shared<ShadowRunnerControl>();
  auto decode = std::make_shared<ShadowRunnerControl>();
  ExpectSame(RunColocated(cases), RunDisaggregated(cases, /*prefill_budget=*/40,
                                                   InOrder({prefill, decode})));
}

// Controls: skipping either copy gives other tokens, so the test above
// cannot pass without the engine calling both.
TEST_F(DisaggregationTest, SkippedStagingChangesTheTokens) {
  const std::vector<Case> cases = SomeCases(Cases());
  const auto colocated = RunColocated(cases);
  for (const bool skip_prefill_side : {true, false}) {
    auto prefill = std::make_shared<ShadowRunnerControl>();
    auto decode = std::make_shared<ShadowRunnerControl>();
    (skip_prefill_side ? prefill : decode)->skip_copies = true;
    const auto split = RunDisaggregated(cases, 512, InOrder({prefill, decode}));
    int differing = 0;
    for (const Case& c : cases) {
      if (split.at(c.id).tokens != colocated.at(c.id).tokens) ++differing;
    }
    EXPECT_GE(differing, 1) << "skip_prefill_side=" << skip_prefill_side;
  }
}

TEST_F(DisaggregationTest, DeviceFaultFailsTheStepAndTheEngineTurnsUnhealthy) {
  auto control = std::make_shared<ShadowRunnerControl>();
  control->fail_forward_at = 2;  // the first decode step
  auto engine = MakeEngine(512, 16, 256, ShadowRunner::Factory(control));
  ASSERT_TRUE(engine->health().ok());
  absl::Mutex mu;
  std::map<std::string, Outcome> results;
  // Short prompts that cannot end before the fault (also run under TSan).
  std::vector<Case> cases = Cases();
  cases.resize(3);
  for (Case& c : cases) {
    c.params.stop.clear();
    c.params.ignore_eos = true;
  }
  for (const Case& c : cases) {
    ASSERT_TRUE(
        engine->Submit({c.id, c.prompt, c.params}, Collect(&results[c.id], &mu))
            .ok());
  }
  engine->RunUntilIdle();
  for (const Case& c : cases) {
    const Outcome& r = results.at(c.id);
    EXPECT_EQ(r.reason, FinishReason::kError) << c.id;
    EXPECT_THAT(r.error.message(), HasSubstr("injected device fault")) << c.id;
  }
  ExpectAllFree(*engine);
  const absl::Status health = engine->health();
  EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(health.message(), HasSubstr("shadow:0"));
  EXPECT_THAT(health.message(), HasSubstr("injected device fault"));
  const absl::Status refused = engine->Submit(
      {"late", cases[0].prompt, cases[0].params}, Collect(&results["x"], &mu));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  ImportOptions import;
  import.transfer_id = 9;
  import.num_prompt_tokens = 4;
  import.max_tokens = 4;
  EXPECT_EQ(engine->ReserveImport("imp", import).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(DisaggregationTest, FailedStagingFailsTheHandoffAndFreesItsBlocks) {
  auto control = std::make_shared<ShadowRunnerControl>();
  control->fail_copy_to_host = true;
  auto engine = MakeEngine(512, 16, 256, ShadowRunner::Factory(control));
  const Case c = Cases()[1];
  PrefillResult result;
  PrefillOptions options;
  auto state = std::make_shared<InMemoryKvSink::State>();
  options.make_sink =
      [state](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return std::make_unique<InMemoryKvSink>(state);
  };
  ASSERT_TRUE(engine
                  ->SubmitPrefill({c.id, c.prompt, c.params}, options,
                                  CollectPrefill(&result))
                  .ok());
  engine->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_THAT(result.last.error.message(),
              HasSubstr("copying the KV to the host"));
  EXPECT_THAT(result.last.error.message(), HasSubstr("copy-to-host fault"));
  EXPECT_TRUE(state->layers.empty()) << "a layer was released unstaged";
  EXPECT_FALSE(state->finished);
  ExpectAllFree(*engine);
}

TEST_F(DisaggregationTest, FailedImportCopyFailsTheRequestAndFreesItsBlocks) {
  auto control = std::make_shared<ShadowRunnerControl>();
  control->fail_copy_to_device = true;
  auto decode = MakeEngine(512, 16, 256, ShadowRunner::Factory(control));
  auto prefill = MakeEngine();
  auto receiver = StartReceiver(*decode);
  const Case c = Cases()[1];
  ImportOptions import;
  import.transfer_id = 1;
  import.num_prompt_tokens = static_cast<int64_t>(c.prompt.size());
  import.max_tokens = c.params.max_tokens;
  absl::Notification landed;
  import.on_landed = [&landed](absl::Status s) { EXPECT_TRUE(s.ok()) << s;
  landed.Notify();
};
ASSERT_TRUE(decode->ReserveImport(c.id, import).ok());
PrefillOptions options;
options.make_sink = TcpKvSinkFactory(receiver->endpoint(), 1);
PrefillResult first;
ASSERT_TRUE(prefill
                ->SubmitPrefill({c.id, c.prompt, c.params}, options,
                                CollectPrefill(&first))
                .ok());
prefill->RunUntilIdle();
ASSERT_TRUE(first.done&& first.first.has_value()) << first.last.error;
ASSERT_TRUE(landed.WaitForNotificationWithTimeout(absl::Seconds(30)));
SamplingParams params = c.params;
params.seed = first.seed;
absl::Mutex mu;
Outcome out;
ASSERT_TRUE(decode
                ->StartImportedDecode({c.id, c.prompt, params},
                                      {first.first->token}, Collect(&out, &mu))
                .ok());
decode->RunUntilIdle();
EXPECT_EQ(out.reason, FinishReason::kError);
EXPECT_THAT(out.error.message(), HasSubstr("copying the imported KV"));
EXPECT_THAT(out.error.message(), HasSubstr("shadow:0"));
EXPECT_EQ(control->forwards, 0) << "the sequence ran without its KV";
ExpectAllFree(*decode);
ExpectAllFree(*prefill);
}  // namespace

}  // namespace baton
}  // namespace baton
