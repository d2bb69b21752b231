#include "bench/sim/step_queue.h"

#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/sim/prefix_model.h"
#include "gtest/gtest.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton::sim {
namespace {

using ::testing::TestWithParam;

std::optional<int64_t> Uncached(int) { return 0; }

TEST(StepQueueTest, ChunksPromptsUnderTheBudgetAfterTheDecodes) {
  StepQueue q(/*max_num_seqs=*/4, /*max_batch_tokens=*/8);
  q.AddRunning(0, 5);  // decoding
  q.AddWaiting(1, 10);
  q.AddWaiting(2, 3);
  std::vector<StepQueue::Item> step;
  q.Schedule(Uncached, &step);
  ASSERT_EQ(step.size(), 2u);
  EXPECT_TRUE(step[0].decode);
  EXPECT_EQ(step[0].tokens, 1);
  EXPECT_EQ(step[1].r, 1);
  EXPECT_EQ(step[1].tokens, 7);  // the budget's rest
  EXPECT_FALSE(step[1].samples);
  q.Advance(step);
  q.Schedule(Uncached, &step);
  ASSERT_EQ(step.size(), 3u);
  EXPECT_EQ(step[1].r, 1);
  EXPECT_EQ(step[1].start, 7);
  EXPECT_EQ(step[1].tokens, 3);  // its last chunk
  EXPECT_TRUE(step[1].samples);
  EXPECT_EQ(step[2].r, 2);
  EXPECT_EQ(step[2].tokens, 3);
  EXPECT_TRUE(step[2].samples);
}

TEST(StepQueueTest, AdmissionStopsAtTheSeqLimitAndAtARefusal) {
  StepQueue q(/*max_num_seqs=*/2, /*max_batch_tokens=*/100);
  for (int r = 0; r < 3; ++r) q.AddWaiting(r, 4);
  std::vector<StepQueue::Item> step;
  q.Schedule(Uncached, &step);
  EXPECT_EQ(step.size(), 2u);
  EXPECT_EQ(q.num_waiting(), 1);
  StepQueue refusing(4, 100);
  refusing.AddWaiting(0, 4);
  refusing.AddWaiting(1, 4);
  refusing.Schedule([](int) -> std::optional<int64_t> { return {}; }, &step);
  EXPECT_TRUE(step.empty());
  EXPECT_EQ(refusing.num_waiting(), 2);
}

TEST(StepQueueTest, ACachedPrefixIsNotFedAgain) {
  StepQueue q(4, 100);
  q.AddWaiting(0, 32);
  std::vector<StepQueue::Item> step;
  q.Schedule([](int) -> std::optional<int64_t> { return 16; }, &step);
  ASSERT_EQ(step.size(), 1u);
  EXPECT_EQ(step[0].start, 16);
  EXPECT_EQ(step[0].tokens, 16);
  EXPECT_TRUE(step[0].samples);
}

struct Mix {
  int64_t max_num_seqs;
  int64_t max_batch_tokens;
  int64_t max_prompt;
  uint32_t seed;
};

// The engine's step and StepQueue's feed the same sequences the same tokens,
// in the same order, from the same cached positions.
void ExpectSameStep(const std::vector<ScheduledItem>& real,
                    const std::vector<StepQueue::Item>& sim,
                    const std::vector<std::unique_ptr<Sequence>>& seqs,
                    int64_t step) {
  ASSERT_EQ(real.size(), sim.size()) << "step " << step;
  for (size_t i = 0; i < real.size(); ++i) {
    const Sequence* seq = seqs[static_cast<size_t>(sim[i].r)].get();
    ASSERT_EQ(real[i].seq, seq) << "step " << step << " item " << i;
    EXPECT_EQ(real[i].num_tokens, sim[i].tokens);
    EXPECT_EQ(real[i].samples, sim[i].samples);
    EXPECT_EQ(seq->num_cached >= seq->num_prompt, sim[i].decode);
    if (!sim[i].decode) {
      EXPECT_EQ(seq->num_cached, sim[i].start);
    }
  }
}

class StepQueueVsSchedulerTest : public TestWithParam<Mix> {};

// The same arrivals through StepQueue and the engine's Scheduler (a pool
// too large to preempt): every step feeds the same sequences the same
// tokens, in the same order.
TEST_P(StepQueueVsSchedulerTest, ComposesEveryStepAsTheEngine) {
  const Mix mix = GetParam();
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = 1;
  options.head_dim = 1;
  options.num_blocks = 1 << 20;
  options.host_storage = false;
  auto cache = KvCache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  Scheduler scheduler({.max_num_seqs = mix.max_num_seqs,
                       .max_num_batched_tokens = mix.max_batch_tokens},
                      cache->get());
  StepQueue queue(mix.max_num_seqs, mix.max_batch_tokens);

  std::mt19937 rng(mix.seed);
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<int64_t> outputs;  // tokens each still generates
  int next = 0;
  int64_t steps = 0;
  for (int round = 0; round < 400; ++round) {
    // Up to 3 new requests before each step: prompts, and sometimes an
    // imported sequence (a decode worker's landed KV).
    for (int k = static_cast<int>(rng() % 4); k > 0 && next < 200; --k) {
      auto seq = std::make_unique<Sequence>();
      const int64_t prompt =
          1 +
          static_cast<int64_t>(rng() % static_cast<uint32_t>(mix.max_prompt));
      seq->tokens.assign(static_cast<size_t>(prompt), 7);
      seq->num_prompt = prompt;
      outputs.push_back(1 + static_cast<int64_t>(rng() % 20));
      if (rng() % 5 == 0) {
        // As an imported sequence: the prompt cached, its first token
        // sampled by the prefill worker.
        seq->tokens.push_back(7);
        ASSERT_TRUE((*cache)->Reserve(seq->table, prompt + 1).ok());
        seq->num_cached = prompt;
        seq->admitted = true;
        scheduler.AddRunning(seq.get());
        queue.AddRunning(next, prompt);
      } else {
        scheduler.AddWaiting(seq.get());
        queue.AddWaiting(next, prompt);
      }
      seqs.push_back(std::move(seq));
      ++next;
    }
    std::vector<Sequence*> preempted;
    const std::vector<ScheduledItem> real = scheduler.Schedule(&preempted);
    ASSERT_TRUE(preempted.empty());
    std::vector<StepQueue::Item> sim;
    queue.Schedule(Uncached, &sim);
    ASSERT_NO_FATAL_FAILURE(ExpectSameStep(real, sim, seqs, steps));
    queue.Advance(sim);
    for (size_t i = 0; i < real.size(); ++i) {
      Sequence* seq = real[i].seq;
      seq->num_cached += real[i].num_tokens;
      if (!real[i].samples) continue;
      const int r = sim[i].r;
      if (--outputs[static_cast<size_t>(r)] == 0) {
        scheduler.Remove(seq);
        queue.Remove(r);
      } else {
        seq->tokens.push_back(7);
      }
    }
    ++steps;
  }
  EXPECT_GT(steps, 100);
}

INSTANTIATE_TEST_SUITE_P(
    Mixes, StepQueueVsSchedulerTest,
    ::testing::Values(Mix{64, 512, 1500, 1}, Mix{4, 512, 300, 2},
                      Mix{8, 64, 200, 3}, Mix{256, 2048, 4000, 4}),
    [](const ::testing::TestParamInfo<Mix>& info) {
      return "seqs" + std::to_string(info.param.max_num_seqs) + "_budget" +
             std::to_string(info.param.max_batch_tokens);
    });

// Prompts named by pieces as Mooncake's traces name them (an id per piece,
// equal ids only after equal prefixes), through the engine's Scheduler with
// its prefix cache fed as the engine feeds it (each step's full blocks
// published), and through StepQueue with baton-sim's prefix model as a
// prefill worker keeps it (each chunk's full blocks stored; a hit shares the
// blocks before the last token's). Every admission finds the same cached
// prefix, and every step feeds the same tokens.
TEST(StepQueuePrefixVsSchedulerTest, FindsTheEnginesPrefixHits) {
  constexpr int64_t kBlock = 16;
  constexpr int64_t kPiece = 32;
  for (const Mix mix : {Mix{8, 64, 0, 5}, Mix{64, 512, 0, 6}}) {
    KvCacheOptions options;
    options.num_layers = 1;
    options.num_kv_heads = 1;
    options.head_dim = 1;
    options.block_size = kBlock;
    options.num_blocks = 1 << 16;
    options.host_storage = false;
    auto cache = KvCache::Create(options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const BlockHash root = PrefixRootHash("step-queue-test");
    Scheduler scheduler({.max_num_seqs = mix.max_num_seqs,
                         .max_num_batched_tokens = mix.max_batch_tokens},
                        cache->get(), {.enabled = true, .root = root});
    StepQueue queue(mix.max_num_seqs, mix.max_batch_tokens);
    PrefixModel model(kBlock, kPiece);
    model.AddWorker("prefill", options.num_blocks);

    std::mt19937 rng(mix.seed);
    std::vector<std::vector<int64_t>> pieces;  // each request's piece ids
    std::vector<std::vector<BlockHash>> chains;
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<int64_t> outputs;
    int64_t next_piece = 0, sim_hits = 0;
    for (int round = 0; round < 300; ++round) {
      for (int k = static_cast<int>(rng() % 3); k > 0 && seqs.size() < 150;
           --k) {
        // A conversation's next turn (an earlier prompt's leading pieces
        // and new ones), or a new one.
        std::vector<int64_t> ids;
        if (!pieces.empty() && rng() % 3 != 0) {
          const auto& earlier = pieces[rng() % pieces.size()];
          ids.assign(earlier.begin(),
                     earlier.begin() + 1 + rng() % earlier.size());
        }
        // Sometimes none (the same prompt again, cached to its end).
        for (int n = static_cast<int>(rng() % 5) - (ids.empty() ? 0 : 1);
             n >= 0; --n) {
          ids.push_back(next_piece++);
        }
        // Ending on a block's edge half of the time.
        const int64_t cut = rng() % 2 == 0
                                ? kBlock * static_cast<int64_t>(rng() % 2)
                                : static_cast<int64_t>(rng() % kPiece);
        const int64_t len = static_cast<int64_t>(ids.size()) * kPiece - cut;
        auto seq = std::make_unique<Sequence>();
        for (int64_t t = 0; t < len; ++t) {
          seq->tokens.push_back(static_cast<int32_t>(
              100 + ids[static_cast<size_t>(t / kPiece)] * kPiece +
              t % kPiece));
        }
        seq->num_prompt = len;
        scheduler.AddWaiting(seq.get());
        queue.AddWaiting(static_cast<int>(seqs.size()), len);
        chains.push_back(model.Chain(ids, len));
        pieces.push_back(std::move(ids));
        outputs.push_back(1 + static_cast<int64_t>(rng() % 10));
        seqs.push_back(std::move(seq));
      }
      std::vector<Sequence*> preempted;
      const std::vector<ScheduledItem> real = scheduler.Schedule(&preempted);
      ASSERT_TRUE(preempted.empty());
      std::vector<StepQueue::Item> sim;
      queue.Schedule(
          [&](int r) -> std::optional<int64_t> {
            const std::vector<BlockHash>& chain =
                chains[static_cast<size_t>(r)];
            const int64_t len = seqs[static_cast<size_t>(r)]->num_prompt;
            const int64_t held = model.Use(0, chain, options.num_blocks);
            const int64_t hit = std::min(held, (len - 1) / kBlock) * kBlock;
            sim_hits += hit;
            return hit;
          },
          &sim);
      ASSERT_NO_FATAL_FAILURE(ExpectSameStep(real, sim, seqs, round));
      queue.Advance(sim);
      for (size_t i = 0; i < real.size(); ++i) {
        Sequence* seq = real[i].seq;
        const int r = sim[i].r;
        seq->num_cached += real[i].num_tokens;
        // What the runner's forward pass records.
        ASSERT_TRUE((*cache)->SetNumTokens(seq->table, seq->num_cached).ok());
        PublishFullBlocks(root, (*cache)->allocator(), seq);
        if (!sim[i].decode) {
          const std::vector<BlockHash>& chain = chains[static_cast<size_t>(r)];
          const auto stored = std::min(
              chain.size(),
              static_cast<size_t>((sim[i].start + sim[i].tokens) / kBlock));
          model.Store(0, std::span(chain).first(stored), options.num_blocks);
        }
        if (!real[i].samples) continue;
        if (--outputs[static_cast<size_t>(r)] == 0) {
          scheduler.Remove(seq);
          queue.Remove(r);
        } else {
          seq->tokens.push_back(7);
        }
      }
    }
    EXPECT_EQ(sim_hits, scheduler.prefix_hit_tokens());
    EXPECT_GT(sim_hits, 10 * kPiece) << "too few hits to tell";
  }
}

}  // namespace
}  // namespace baton::sim
