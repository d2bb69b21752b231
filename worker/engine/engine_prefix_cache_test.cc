// The prefix cache is exact: a request's tokens and log-probabilities are
// bit-identical with the cache on or off, hit or miss, for any split point,
// for a fully cached prompt, for a next turn that reuses the previous
// answer's KV (computed one token at a time while decoding), under
// concurrency and under eviction; and the accounting holds throughout.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/default_model_test_base.h"
#include "worker/engine/engine.h"

namespace baton {
namespace {

constexpr int64_t kBlockSize = 16;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kNone;
  absl::Status error;
  int64_t cached_tokens = -1;
};

class EnginePrefixCacheTest : public testing::DefaultModelTest {
 protected:
  static std::unique_ptr<Engine> MakeEngine(bool prefix_cache,
                                            int64_t blocks = 128) {
    EngineOptions options;
    options.num_threads = 2;
    options.block_size = kBlockSize;
    options.kv_cache_blocks = blocks;
    options.prefix_cache = prefix_cache;
    options.model_id = "smollm2";
    auto engine = Engine::Create(options, weights_, tokenizer_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  static SamplingParams Params(int i, int32_t max_tokens = 6) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.logprobs = 0;  // the chosen token's log-probability only
    if (i % 2 == 0) {
      p.temperature = 0.0;
    } else {
      p.temperature = 0.9;
      p.top_k = 40;
      p.seed = 500 + i;
    }
    return p;
  }

  static void Submit(Engine& engine, const std::string& id,
                     std::vector<int32_t> prompt, SamplingParams params,
                     std::map<std::string, Result>* results) {
    absl::Status s =
        engine.Submit({id, std::move(prompt), params},
                      [results, id](const RequestOutput& out) {
                        Result& r = (*results)[id];
                        for (const TokenOutput& t : out.tokens) {
                          r.tokens.push_back(t.token);
                          r.logprobs.push_back(t.logprob.value_or(1.0f));
                        }
                        r.reason = out.finish_reason;
                        r.error = out.error;
                        if (out.finish_reason != FinishReason::kNone) {
                          r.cached_tokens = out.metrics.cached_tokens;
                        }
                      });
    ASSERT_TRUE(s.ok()) << s;
  }

  // Runs one request alone on `engine` to completion.
  static Result RunOne(Engine& engine, const std::string& id,
                       const std::vector<int32_t>& prompt,
                       SamplingParams params) {
    std::map<std::string, Result> results;
    Submit(engine, id, prompt, params, &results);
    engine.RunUntilIdle();
    return results[id];
  }

  static void ExpectSame(const Result& got, const Result& want,
                         const std::string& what) {
    EXPECT_EQ(got.error, absl::OkStatus()) << what;
    EXPECT_EQ(got.tokens, want.tokens) << what;
    // Bit-identical log-probabilities: the logits did not move either.
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(got.logprobs[i]),
                std::bit_cast<uint32_t>(want.logprobs[i]))
          << what << " token " << i;
    }
  }

  static void ExpectAccounting(Engine& engine) {
    KvCache& cache = engine.kv_cache();
    const BlockAllocator& a = cache.allocator();
    EXPECT_EQ(
        a.num_blocks_empty() + a.num_blocks_cached() + a.num_blocks_used(),
        a.num_blocks_total());
    EXPECT_EQ(a.num_blocks_used(), 0) << "a finished request holds blocks";
    EXPECT_TRUE(cache.CheckInvariants().ok()) << cache.CheckInvariants();
  }

  std::vector<int32_t> Chat(const std::string& system,
                            const std::string& user) {
    return tokenizer_->Encode("<|im_start|>system\n" + system +
                              "<|im_end|>\n<|im_start|>user\n" + user +
                              "<|im_end|>\n<|im_start|>assistant\n");
  }
};

TEST_F(EnginePrefixCacheTest, AnySplitPointGivesTheTokensOfACacheOffRun) {
  const std::vector<int32_t> prompt = Chat(
      "You are a terse assistant who answers in one short sentence, "
      "names places precisely and never repeats the question.",
      "Name three rivers of Europe, the countries they cross and the "
      "seas they flow into.");
  const int64_t n = static_cast<int64_t>(prompt.size());
  ASSERT_GT(n, 3 * kBlockSize + 2);
  auto off = MakeEngine(false);
  auto on = MakeEngine(true);
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  const Result want_greedy = RunOne(*off, "ref0", prompt, Params(0));
  const Result want_seeded = RunOne(*off, "ref1", prompt, Params(1));
  EXPECT_EQ(want_greedy.cached_tokens, 0);
  // Warm the cache with the prompt's first `split` tokens, then run the
  // whole prompt: it reuses every full block of the warm-up that lies
  // before its own last token.
  for (int64_t split :
       {kBlockSize - 1, kBlockSize, kBlockSize + 1, 2 * kBlockSize - 1,
        2 * kBlockSize, 2 * kBlockSize + 1, 3 * kBlockSize + 2, n - 1, n}) {
    for (int i : {0, 1}) {
      const std::string what =
          "split " + std::to_string(split) + (i ? " seeded" : " greedy");
      on->ResetPrefixCache();
      RunOne(*on, "warm", {prompt.begin(), prompt.begin() + split},
             Params(0, 1));
      const Result got = RunOne(*on, "p", prompt, Params(i));
      ExpectSame(got, i ? want_seeded : want_greedy, what);
      const int64_t shareable = (n - 1) / kBlockSize * kBlockSize;
      EXPECT_EQ(got.cached_tokens,
                std::min(split / kBlockSize * kBlockSize, shareable))
          << what;
      ExpectAccounting(*on);
    }
  }
  // A prompt that differs in one token, anywhere in a block, shares only
  // the blocks before that one.
  for (int64_t at : {int64_t{0}, kBlockSize + kBlockSize / 2 + 1,
                     2 * kBlockSize - 1, 2 * kBlockSize}) {
    const std::string what = "neighbour differing at " + std::to_string(at);
    on->ResetPrefixCache();
    std::vector<int32_t> neighbour = prompt;
    neighbour[static_cast<size_t>(at)] =
        prompt[static_cast<size_t>(at)] == 13 ? 14 : 13;
    RunOne(*on, "warm", neighbour, Params(0, 1));
    const Result got = RunOne(*on, "p", prompt, Params(0));
    ExpectSame(got, want_greedy, what);
    EXPECT_EQ(got.cached_tokens, at / kBlockSize * kBlockSize) << what;
  }
  // The same prompt again reuses all but the block of its last token.
  const Result again = RunOne(*on, "again", prompt, Params(0));
  ExpectSame(again, want_greedy, "fully cached prompt");
  EXPECT_EQ(again.cached_tokens, (n - 1) / kBlockSize * kBlockSize);
  EngineStats stats = on->stats();
  EXPECT_GT(stats.prefix_hit_tokens, 0);
  EXPECT_GT(stats.prefix_query_tokens, stats.prefix_hit_tokens);
  EXPECT_GT(stats.kv_blocks_cached, 0);
}

// Turn 2 resends turn 1 with its answer: the answer's full blocks, whose
// KV was computed token by token while decoding, are reused too.
TEST_F(EnginePrefixCacheTest, NextTurnReusesTheAnswerAndMatchesACacheOffRun) {
  auto off = MakeEngine(false);
  auto on = MakeEngine(true);
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  std::vector<int32_t> history =
      Chat("You are a helpful assistant.", "Tell me about the moon.");
  int64_t fed_before = 0;  // tokens whose KV the previous turn computed
  for (int turn = 0; turn < 3; ++turn) {
    const std::string what = "turn " + std::to_string(turn);
    const SamplingParams params = Params(turn, 24);
    const std::string id = "t" + std::to_string(turn);
    const Result want = RunOne(*off, id, history, params);
    const Result got = RunOne(*on, id, history, params);
    ExpectSame(got, want, what);
    // Every full block the previous turn computed, prompt and answer,
    // short of the block holding this prompt's last token.
    const int64_t n = static_cast<int64_t>(history.size());
    EXPECT_EQ(
        got.cached_tokens,
        std::min(fed_before / kBlockSize, (n - 1) / kBlockSize) * kBlockSize)
        << what;
    history.insert(history.end(), want.tokens.begin(), want.tokens.end());
    fed_before = static_cast<int64_t>(history.size()) - 1;
    const std::vector<int32_t> next = tokenizer_->Encode(
        "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n"
        "<|im_start|>assistant\n");
    history.insert(history.end(), next.begin(), next.end());
  }
  ExpectAccounting(*on);
}

// Many requests sharing a system prompt in one batch, on a pool small
// enough that cached blocks are evicted (and requests preempted): every
// request still gets the tokens of a cache-off run.
TEST_F(EnginePrefixCacheTest, SharedPrefixUnderConcurrencyAndEviction) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(Chat(
        "You answer questions about numbers briefly.",
        "What is special about the number " + std::to_string(i * 7 + 3) + "?"));
  }
  std::map<std::string, Result> want;
  {
    auto off = MakeEngine(false);
    ASSERT_NE(off, nullptr);
    for (int i = 0; i < 12; ++i) {
      Submit(*off, std::to_string(i), prompts[i], Params(i), &want);
    }
    off->RunUntilIdle();
  }
  for (int64_t blocks : {int64_t{128}, int64_t{14}}) {
    auto on = MakeEngine(true, blocks);
    ASSERT_NE(on, nullptr);
    std::map<std::string, Result> got;
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 12; ++i) {
        Submit(*on, std::to_string(i), prompts[i], Params(i), &got);
      }
      on->RunUntilIdle();
      for (int i = 0; i < 12; ++i) {
        const std::string id = std::to_string(i);
        ExpectSame(got[id], want[id],
                   "pool " + std::to_string(blocks) + " round " +
                       std::to_string(round) + " request " + id);
      }
      got.clear();
      ExpectAccounting(*on);
    }
    EngineStats stats = on->stats();
    EXPECT_GT(stats.prefix_hit_tokens, 0) << "pool " << blocks;
    if (blocks == 14) {
      EXPECT_GT(stats.kv_evictions, 0);
    }
  }
}

}  // namespace
}  // namespace baton
