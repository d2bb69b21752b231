#include "worker/engine/engine.h"

#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/simulated_runner.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  absl::Status error;
  int outputs = 0;
};

class EngineTest : public testing::DefaultModelTest {
 protected:
  std::unique_ptr<Engine> MakeEngine(int64_t blocks = 256, int64_t budget = 512,
                                     int64_t max_seqs = 64) {
    EngineOptions options;
    options.num_threads = 2;
    options.kv_cache_blocks = blocks;
    options.scheduler.max_num_batched_tokens = budget;
    options.scheduler.max_num_seqs = max_seqs;
    auto engine = Engine::Create(options, weights_, tokenizer_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  }

  static absl::Status Submit(Engine& engine, const std::string& id,
                             std::vector<int32_t> prompt, SamplingParams params,
                             std::map<std::string, Result>* results) {
    return engine.Submit({id, std::move(prompt), params},
                         [results, id](const RequestOutput& out) {
                           Result& r = (*results)[id];
                           ++r.outputs;
                           for (const TokenOutput& t : out.tokens)
                             r.tokens.push_back(t.token);
                           r.text += out.text;
                           r.reason = out.finish_reason;
                           r.error = out.error;
                         });
  }

  static void ExpectAllBlocksFree(Engine& engine) {
    EXPECT_EQ(engine.kv_cache().num_blocks_free(),
              engine.kv_cache().num_blocks_total());
    EXPECT_TRUE(engine.kv_cache().CheckInvariants().ok());
  }

  std::vector<int32_t> Chat(const std::string& user) {
    return tokenizer_->Encode("<|im_start|>user\n" + user +
                              "<|im_end|>\n<|im_start|>assistant\n");
  }
};

SamplingParams Greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.max_tokens = max_tokens;
  return p;
}

TEST_F(EngineTest, GreedyAnswerAndFinishReasons) {
  auto engine = MakeEngine();
  std::map<std::string, Result> results;
  ASSERT_TRUE(Submit(*engine, "a", Chat("What is the capital of France?"),
                     Greedy(32), &results)
                  .ok());
  SamplingParams long_params = Greedy(12);
  long_params.ignore_eos = true;
  ASSERT_TRUE(
      Submit(*engine, "b", Chat("Count to ten."), long_params, &results).ok());
  engine->RunUntilIdle();
  EXPECT_THAT(results["a"].text, HasSubstr("Paris"));
  EXPECT_EQ(results["a"].reason, FinishReason::kStop);  // <|im_end|>
  EXPECT_EQ(results["b"].reason, FinishReason::kLength);
  EXPECT_EQ(results["b"].tokens.size(), 12u);
  EXPECT_EQ(results["b"].outputs, 12);
  ExpectAllBlocksFree(*engine);
}

TEST(PrefillRateTest, RecentStepsWeighMore) {
  PrefillRate rate;
  EXPECT_EQ(rate.tokens_per_second(), 0);
  rate.Record(0, 1.0);  // a decode-only step
  rate.Record(10, 0);   // no time measured
  EXPECT_EQ(rate.tokens_per_second(), 0);
  rate.Record(100, 0.1);
  EXPECT_DOUBLE_EQ(rate.tokens_per_second(), 1000);
  rate.Record(100, 1.0);  // (0.75 * 100 + 100) / (0.75 * 0.1 + 1)
  EXPECT_DOUBLE_EQ(rate.tokens_per_second(), 175 / 1.075);
}

TEST_F(EngineTest, ReportsItsPrefillRate) {
  auto engine = MakeEngine();
  EXPECT_EQ(engine->stats().prefill_tokens_per_second, 0);
  std::map<std::string, Result> results;
  ASSERT_TRUE(
      Submit(*engine, "a", Chat("Count to ten."), Greedy(4), &results).ok());
  engine->RunUntilIdle();
  EXPECT_GT(engine->stats().prefill_tokens_per_second, 0);
}

// The simulated runner (baton-worker --engine=simulated) computes nothing
// and prefers SimulatedToken(position, last token) at every step, through
// the engine's real scheduler, sampler and KV accounting.
TEST_F(EngineTest, SimulatedRunnerFollowsItsTokenRule) {
  WorkerProfile profile;
  profile.prefill.c1 = 1e-6;
  profile.decode.c0 = 1e-4;
  EngineOptions options;
  options.kv_cache_blocks = 64;
  options.make_runner = SimulatedRunnerFactory(profile);
  auto engine = Engine::Create(options, weights_, tokenizer_);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = Chat("Count to ten.");
  SamplingParams params = Greedy(8);
  params.ignore_eos = true;
  std::map<std::string, Result> results;
  ASSERT_TRUE(Submit(**engine, "s", prompt, params, &results).ok());
  (*engine)->RunUntilIdle();
  std::vector<int32_t> expected;
  int32_t last = prompt.back();
  for (size_t i = 0; i < 8; ++i) {
    last = SimulatedToken(static_cast<int64_t>(prompt.size() - 1 + i), last,
                          weights_->config().vocab_size);
    expected.push_back(last);
  }
  EXPECT_EQ(results["s"].tokens, expected);
  EXPECT_EQ(results["s"].reason, FinishReason::kLength);
  ExpectAllBlocksFree(**engine);
}

// Waiting prompts are admitted in the order they reached the cluster (the
// coordinator's stamp), not the order their calls reached the engine; an
// unstamped one counts as arriving when it reached the engine. The budget
// fits one prompt a step, so the requests end (max_tokens 1) in their
// admission order.
TEST_F(EngineTest, PromptsAreAdmittedInTheOrderTheyReachedTheCluster) {
  const int64_t now = absl::ToUnixMicros(absl::Now());
  EXPECT_EQ(FcfsArrival(0, now), now);
  EXPECT_EQ(FcfsArrival(now - 5, now), now - 5);
  EXPECT_EQ(FcfsArrival(now + 5, now), now);  // not after it got here
  EXPECT_EQ(FcfsArrival(now - 3 * kMaxArrivalLeadUs, now),
            now - kMaxArrivalLeadUs);
  const std::vector<int32_t> prompt = Chat("Name a colour.");
  struct Sent {
    const char* id;
    int64_t arrival_unix_us;
  };
  for (const bool stamped : {true, false}) {
    SCOPED_TRACE(stamped ? "stamped" : "unstamped");
    auto engine = MakeEngine(/*blocks=*/64,
                             /*budget=*/static_cast<int64_t>(prompt.size()));
    std::vector<std::string> ended;
    // Sent in this order; stamped, "a" reached the cluster first and "c"
    // (no stamp) last.
    for (const Sent& r : {Sent{"b", now - 1'000'000}, Sent{"c", 0},
                          Sent{"a", now - 2'000'000}}) {
      GenerationRequest request{r.id, prompt, Greedy(1),
                                stamped ? r.arrival_unix_us : 0};
      ASSERT_TRUE(engine
                      ->Submit(std::move(request),
                               [&ended, id = std::string(r.id)](
                                   const RequestOutput& out) {
                                 if (out.finish_reason != FinishReason::kNone) {
                                   ended.push_back(id);
                                 }
                               })
                      .ok());
    }
    engine->RunUntilIdle();
    const std::vector<std::string> expected =
        stamped ? std::vector<std::string>{"a", "b", "c"}
                : std::vector<std::string>{"b", "c", "a"};
    EXPECT_EQ(ended, expected);
    ExpectAllBlocksFree(*engine);
  }
}

TEST_F(EngineTest, StopStringIsNeverEmitted) {
  auto engine = MakeEngine();
  std::map<std::string, Result> plain, stopped;
  ASSERT_TRUE(Submit(*engine, "x", Chat("What is the capital of France?"),
                     Greedy(32), &plain)
                  .ok());
  engine->RunUntilIdle();
  const std::string& full = plain["x"].text;
  size_t at = full.find("Paris");
  ASSERT_NE(at, std::string::npos) << full;
  SamplingParams p = Greedy(32);
  p.stop = {"aris"};
  ASSERT_TRUE(
      Submit(*engine, "y", Chat("What is the capital of France?"), p, &stopped)
          .ok());
  engine->RunUntilIdle();
  EXPECT_EQ(stopped["y"].text, full.substr(0, at + 1));
  EXPECT_EQ(stopped["y"].reason, FinishReason::kStop);
  ExpectAllBlocksFree(*engine);
}

// A request's tokens do not depend on what else runs with it, on chunked
// prefill, or on preemption and recompute: 33 prompts of different lengths,
// greedy and seeded sampling.
TEST_F(EngineTest, TokensIndependentOfBatchChunkingAndPreemption) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 33; ++i) {
    std::string words;
    for (int w = 0; w <= i * 3 % 40; ++w)
      words += " word" + std::to_string(w * 7 % 13);
    prompts.push_back(Chat("Say something about" + words));
  }
  auto params_for = [](int i) {
    SamplingParams p = Greedy(10);
    p.ignore_eos = true;
    if (i % 2 == 1) {
      p.temperature = 0.8;
      p.top_p = 0.9;
      p.seed = 1000 + i;
    }
    return p;
  };
  std::map<std::string, Result> alone;
  {
    auto engine = MakeEngine();
    for (int i = 0; i < 33; ++i) {
      ASSERT_TRUE(
          Submit(*engine, std::to_string(i), prompts[i], params_for(i), &alone)
              .ok());
      engine->RunUntilIdle();
    }
  }
  struct Config {
    const char* name;
    int64_t blocks, budget, max_seqs;
  };
  for (const Config& config :
       {Config{"batched", 512, 512, 64}, Config{"chunked", 512, 7, 64},
        Config{"preempting", 24, 64, 64}}) {
    auto engine = MakeEngine(config.blocks, config.budget, config.max_seqs);
    std::map<std::string, Result> together;
    for (int i = 0; i < 33; ++i) {
      ASSERT_TRUE(Submit(*engine, std::to_string(i), prompts[i], params_for(i),
                         &together)
                      .ok());
    }
    engine->RunUntilIdle();
    for (int i = 0; i < 33; ++i) {
      const std::string id = std::to_string(i);
      EXPECT_EQ(together[id].tokens, alone[id].tokens)
          << config.name << " request " << i;
      EXPECT_EQ(together[id].reason, FinishReason::kLength);
    }
    ExpectAllBlocksFree(*engine);
  }
}

TEST_F(EngineTest, CancelFreesBlocks) {
  auto engine = MakeEngine();
  std::map<std::string, Result> results;
  SamplingParams p = Greedy(200);
  p.ignore_eos = true;
  ASSERT_TRUE(
      Submit(*engine, "c", Chat("Tell me a long story."), p, &results).ok());
  for (int i = 0; i < 5; ++i) engine->Step();
  EXPECT_LT(engine->kv_cache().num_blocks_free(),
            engine->kv_cache().num_blocks_total());
  engine->Cancel("c");
  engine->RunUntilIdle();
  EXPECT_EQ(results["c"].reason, FinishReason::kCancelled);
  ExpectAllBlocksFree(*engine);
}

TEST_F(EngineTest, RejectsInvalidRequests) {
  auto engine = MakeEngine(/*blocks=*/8);
  std::map<std::string, Result> results;
  auto submit = [&](SamplingParams p, std::vector<int32_t> prompt = {1, 2, 3}) {
    return Submit(*engine, "r", std::move(prompt), p, &results);
  };
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THAT(std::string(submit(p).message()), HasSubstr("temperature"));
  p = SamplingParams();
  p.top_p = 1.5;
  EXPECT_THAT(std::string(submit(p).message()), HasSubstr("top_p"));
  p = SamplingParams();
  p.top_k = -1;
  EXPECT_THAT(std::string(submit(p).message()), HasSubstr("top_k"));
  p = SamplingParams();
  p.max_tokens = 0;
  EXPECT_THAT(std::string(submit(p).message()), HasSubstr("max_tokens"));
  EXPECT_EQ(submit(SamplingParams(), {}).code(),
            absl::StatusCode::kInvalidArgument);
  p = SamplingParams();
  p.max_tokens = 8190;
  EXPECT_THAT(std::string(submit(p).message()), HasSubstr("8192"));
  EXPECT_EQ(submit(SamplingParams(), {1, 49152}).code(),
            absl::StatusCode::kInvalidArgument);
  p = SamplingParams();
  p.max_tokens = 200;  // 8 blocks hold 128 tokens: never fits
  EXPECT_EQ(submit(p).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(submit(SamplingParams()).ok());
  EXPECT_THAT(std::string(submit(SamplingParams()).message()),
              HasSubstr("already in use"));
  engine->RunUntilIdle();
  ExpectAllBlocksFree(*engine);
}

}  // namespace
}  // namespace baton
