// Prefill/decode disaggregation in one process: a prefill engine hands each
// request's KV cache over a real loopback TCP transport to a decode engine,
// and the tokens must equal a colocated run bit for bit; failures, cancels
// and timeouts must leave every block free on both engines.
#include "worker/engine/disaggregation_test_util.h"
#include "worker/engine/model_runner.h"

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

// Calls `hook(items, layer)` on the engine thread after each layer of every
// step, before the engine's own per-layer work.
class LayerHookRunner : public ForwardRunner {
 public:
  using Hook = std::function<void(std::span<const ForwardItem>, int64_t)>;
  LayerHookRunner(std::unique_ptr<ForwardRunner> inner, Hook hook)
      : inner_(std::move(inner)), hook_(std::move(hook)) {}
  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    return inner_->Forward(items, logits, [&](int64_t layer) {
      hook_(items, layer);
      if (on_layer_done) on_layer_done(layer);
    });
  }

 private:
  std::unique_ptr<ForwardRunner> inner_;
  Hook hook_;
};

// Confirms its transfer only once released.
class GateSink : public KvSink {
 public:
  GateSink(absl::Notification* release, absl::Notification* confirmed)
      : release_(release), confirmed_(confirmed) {}
  absl::Status SendLayer(int64_t, std::span<const uint8_t>) override {
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    release_->WaitForNotification();
    confirmed_->Notify();
    return absl::OkStatus();
  }
  void Abort(absl::Status) override {}

 private:
  absl::Notification* release_;
  absl::Notification* confirmed_;
};

// A handoff confirmed while the engine computes a long step of another
// prompt is reported during that step, not after it: a split request's
// decode then starts without waiting for other requests' prefills.
TEST_F(DisaggregationTest, AHandoffConfirmedMidStepIsReportedBeforeItEnds) {
  absl::Notification release, confirmed;
  absl::Mutex mu;
  std::vector<std::string> events;
  auto engine = MakeEngine(
      /*budget=*/1024, 16, 256,
      [&](const ModelWeights* w, KvCache* cache,
          ThreadPool* pool) -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
        auto inner = ModelRunner::Create(w, cache, pool);
        if (!inner.ok()) return inner.status();
        return std::unique_ptr<ForwardRunner>(std::make_unique<LayerHookRunner>(
            std::move(*inner),
            [&](std::span<const ForwardItem> items, int64_t layer) {
              // The long prompt's first layer: the short one's transfer
              // is confirmed now, mid-step.
              if (layer == 0 && items.size() == 1 &&
                  items[0].tokens.size() > 500 && !release.HasBeenNotified()) {
                release.Notify();
                ASSERT_TRUE(confirmed.WaitForNotificationWithTimeout(
                    absl::Seconds(60)));
              }
            }));
      });
  PrefillOptions options;
  options.make_sink =
      [&](const KvSinkInfo&) -> absl::StatusOr<std::unique_ptr<KvSink>> {
    return std::unique_ptr<KvSink>(
        std::make_unique<GateSink>(&release, &confirmed));
  };
  SamplingParams greedy;
  greedy.temperature = 0.0;
  ASSERT_TRUE(engine
                  ->SubmitPrefill({"short", Chat("Hi"), greedy}, options,
                                  [&](const PrefillOutput& o) {
                                    absl::MutexLock lock(&mu);
                                    if (o.done) events.push_back("short done");
                                  })
                  .ok());
  engine->Step();  // its prefill; the handoff waits for its confirmation
  SamplingParams one = greedy;
  one.max_tokens = 1;
  const std::vector<int32_t> long_prompt =
      Chat(Repeat("A fox met a crow who held some cheese. ", 60));
  ASSERT_GT(long_prompt.size(), 500u);
  ASSERT_LE(long_prompt.size(), 1024u);
  ASSERT_TRUE(engine
                  ->Submit({"long", long_prompt, one},
                           [&](const RequestOutput& o) {
                             absl::MutexLock lock(&mu);
                             if (!o.tokens.empty()) {
                               events.push_back("long token");
                             }
                           })
                  .ok());
  engine->RunUntilIdle();
  EXPECT_EQ(events, (std::vector<std::string>{"short done", "long token"}));
  ExpectAllFree(*engine);
}

}  // namespace
}  // namespace baton
