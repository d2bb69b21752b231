// Prefill/decode disaggregation in one process: a prefill engine hands each
// request's KV cache over a real loopback TCP transport to a decode engine,
// and the tokens must equal a colocated run bit for bit; failures, cancels
// and timeouts must leave every block free on both engines.
#include "worker/engine/disaggregation_test_util.h"

namespace baton {
namespace {

using namespace ::baton::disagg_test;  // NOLINT(build/namespaces): fixtures
using ::testing::HasSubstr;

TEST_F(DisaggregationTest, SameTokensAsColocatedOverTcp) {
  const std::vector<Case> cases = Cases();
  const auto colocated = RunColocated(cases);
  int stopped_by_string = 0;
  for (const Case& c : cases) {
    const Outcome& r = colocated.at(c.id);
    if (!c.params.stop.empty() && r.reason == FinishReason::kStop) {
      ++stopped_by_string;
    }
  }
  EXPECT_GE(stopped_by_string, 1) << "no case exercised a stop string";
  const auto split = RunDisaggregated(cases, /*prefill_budget=*/512);
  ExpectSame(colocated, split);
}

// The prefill engine's budget is smaller than the prompts: the layers of the
// earlier chunks are complete when the last chunk streams.
TEST_F(DisaggregationTest, ChunkedPrefillHandsOffTheSameCache) {
  std::vector<Case> cases = Cases();
  cases = {cases[1], cases[6], cases[7]};
  for (const Case& c : cases) ASSERT_GT(c.prompt.size(), 8u);
  ExpectSame(RunColocated(cases),
             RunDisaggregated(cases, /*prefill_budget=*/8));
}

// A stop string that spans the first token (sampled by the prefill engine)
// and the second (sampled by the decode engine) still stops the request.
TEST_F(DisaggregationTest, StopStringSpanningTheHandoff) {
  Case c;
  c.id = "span";
  c.prompt = Chat("What is the capital of France?");
  c.params.temperature = 0.0;
  c.params.max_tokens = 16;
  const auto plain = RunColocated({c});
  const Outcome& p = plain.at("span");
  ASSERT_GE(p.tokens.size(), 3u);
  const std::string first = tokenizer_->Decode({&p.tokens[0], 1});
  const std::string second = tokenizer_->Decode({&p.tokens[1], 1});
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  c.params.stop = {first.substr(first.size() - 1) + second.substr(0, 1)};
  const auto colocated = RunColocated({c});
  EXPECT_EQ(colocated.at("span").reason, FinishReason::kStop);
  EXPECT_EQ(colocated.at("span").tokens.size(), 2u);
  ExpectSame(colocated, RunDisaggregated({c}, 512));
}

TEST_F(DisaggregationTest, InMemorySinkGetsEveryLayerOnce) {
  auto engine = MakeEngine(/*budget=*/32);
  auto state = std::make_shared<InMemoryKvSink::State>();
  PrefillOptions options;
  options.make_sink =
      [state](
          const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    EXPECT_EQ(info.request_id, "m");
    return std::unique_ptr<KvSink>(std::make_unique<InMemoryKvSink>(state));
  };
  PrefillResult result;
  const std::vector<int32_t> prompt = Chat(Repeat("One two three. ", 10));
  SamplingParams params;
  params.temperature = 0.0;
  ASSERT_TRUE(engine
                  ->SubmitPrefill({"m", prompt, params}, options,
                                  CollectPrefill(&result))
                  .ok());
  engine->RunUntilIdle();
  ASSERT_TRUE(result.done);
  EXPECT_TRUE(result.last.error.ok()) << result.last.error;
  EXPECT_TRUE(result.first.has_value());
  EXPECT_TRUE(state->finished);
  EXPECT_TRUE(state->aborted.ok());
  const KvCache& cache = engine->kv_cache();
  ASSERT_EQ(static_cast<int64_t>(state->layers.size()),
            cache.layout().num_layers);
  const uint64_t layer_bytes =
      cache.LayerBytesForTokens(static_cast<int64_t>(prompt.size()));
  for (const auto& layer : state->layers) EXPECT_EQ(layer.size(), layer_bytes);
  EXPECT_EQ(result.last.handoff.kv_bytes,
            layer_bytes * static_cast<uint64_t>(cache.layout().num_layers));
  ExpectAllFree(*engine);
}

}  // namespace
}  // namespace baton
