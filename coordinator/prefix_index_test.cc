// The coordinator's prefix index and how least_loaded weighs cached
// prefixes against queued work.
#include "coordinator/prefix_index.h"

#include <vector>

#include "coordinator/routing_policy.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

std::vector<BlockHash> Chain(int first_token, int blocks) {
  std::vector<int32_t> tokens(static_cast<size_t>(blocks) * 16);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = first_token + static_cast<int32_t>(i);
  }
  std::vector<BlockHash> chain;
  ExtendBlockHashes(PrefixRootHash("m"), tokens, 16, blocks, &chain);
  return chain;
}

TEST(PrefixIndexTest, SnapshotsDeltasAndForget) {
  PrefixIndex index;
  const std::vector<BlockHash> a = Chain(0, 4);
  const std::vector<BlockHash> b = Chain(1000, 2);
  EXPECT_EQ(index.MatchLength("w1", a), 0);
  index.Apply("w1", /*snapshot=*/true, std::span(a).first(3), {});
  EXPECT_EQ(index.MatchLength("w1", a), 3);
  EXPECT_EQ(index.MatchLength("w2", a), 0);
  // A delta: block 1 evicted, block 3 stored; the match stops at the gap.
  index.Apply("w1", false, std::span(a).subspan(3, 1),
              std::span(a).subspan(1, 1));
  EXPECT_EQ(index.MatchLength("w1", a), 1);
  EXPECT_EQ(index.NumBlocks("w1"), 3);
  // A snapshot replaces everything.
  index.Apply("w1", true, b, {});
  EXPECT_EQ(index.MatchLength("w1", a), 0);
  EXPECT_EQ(index.MatchLength("w1", b), 2);
  index.Forget("w1");
  EXPECT_EQ(index.NumBlocks("w1"), 0);
}

// A worker's entries never outgrow its KV pool: events that would make it
// hold more than max_blocks drop everything of it instead.
TEST(PrefixIndexTest, AWorkerHoldsNoMoreThanItsPool) {
  PrefixIndex index;
  const std::vector<BlockHash> a = Chain(0, 6);
  const std::vector<BlockHash> b = Chain(1000, 3);
  EXPECT_TRUE(index.Apply("w1", true, std::span(a).first(4), {}, 4));
  EXPECT_EQ(index.NumBlocks("w1"), 4);
  // Another block without one evicted: 5 > 4.
  EXPECT_FALSE(index.Apply("w1", false, std::span(a).subspan(4, 1), {}, 4));
  EXPECT_EQ(index.NumBlocks("w1"), 0);
  EXPECT_EQ(index.MatchLength("w1", a), 0);
  // One heartbeat storing more than the pool is refused whole, even with
  // removals beside it.
  EXPECT_TRUE(index.Apply("w1", true, b, {}, 4));
  EXPECT_FALSE(index.Apply("w1", false, a, b, 4));
  EXPECT_EQ(index.NumBlocks("w1"), 0);
  // Other workers keep theirs.
  EXPECT_TRUE(index.Apply("w2", true, b, {}, 3));
  EXPECT_FALSE(index.Apply("w1", true, a, {}, 5));
  EXPECT_EQ(index.NumBlocks("w2"), 3);
  EXPECT_EQ(index.MatchLength("w2", b), 3);
}

// MatchAll gives every worker's MatchLength in one walk: workers that fall
// out at a gap, at a block they never held, or never matched at all.
TEST(PrefixIndexTest, MatchAllAgreesWithMatchLengthForEveryWorker) {
  PrefixIndex index;
  const std::vector<BlockHash> a = Chain(0, 6);
  index.Apply("w1", true, a, {});
  index.Apply("w2", true, std::span(a).first(2), {});
  index.Apply("w3", true, std::span(a).first(5), {});
  index.Apply("w3", false, {}, std::span(a).subspan(3, 1));  // a gap at 3
  index.Apply("w4", true, Chain(1000, 3), {});
  index.Apply("w5", true, std::span(a).subspan(1, 3), {});  // no block 0
  const auto all = index.MatchAll(a);
  EXPECT_EQ(all.size(), 3u);
  for (const char* w : {"w1", "w2", "w3", "w4", "w5"}) {
    const int64_t expected = index.MatchLength(w, a);
    EXPECT_EQ(all.contains(w) ? all.at(w) : 0, expected) << w;
  }
  EXPECT_EQ(all.at("w1"), 6);
  EXPECT_EQ(all.at("w2"), 2);
  EXPECT_EQ(all.at("w3"), 3);
  // Forget frees the worker's slot; a new worker reuses it cleanly.
  index.Forget("w1");
  index.Apply("w6", true, std::span(a).first(1), {});
  const auto after = index.MatchAll(a);
  EXPECT_FALSE(after.contains("w1"));
  EXPECT_EQ(after.at("w6"), 1);
  EXPECT_EQ(index.NumBlocks("w1"), 0);
  EXPECT_EQ(index.NumBlocks("w3"), 4);
  EXPECT_TRUE(index.MatchAll({}).empty());
}

WorkerInfo Both(const char* id, int64_t queued) {
  WorkerInfo w;
  w.ref = WorkerRef{id, 1};
  w.registration.role = WorkerRole::kBoth;
  w.registration.model_id = "m";
  w.registration.kv_layout.block_size = 16;
  w.registration.kv_blocks_total = 100;
  w.load.queued_prefill_tokens = queued;
  w.load.kv_blocks_free = 100;
  w.load.kv_blocks_total = 100;
  return w;
}

TEST(PrefixIndexTest, LeastLoadedWeighsCachedTokensAgainstQueuedOnes) {
  // w2 holds 96 of the prompt's 100 tokens but has 50 queued: with weight
  // 1 its cost is 50 + 100 - 96 = 54 against w1's 10 + 100 = 110.
  const Candidates c = {Both("w1", 10), Both("w2", 50)};
  RequestInfo request;
  request.model_id = "m";
  request.prompt_tokens = 100;
  request.max_tokens = 10;
  request.cached_tokens["w2"] = 96;
  EXPECT_EQ(NewLeastLoadedPolicy(1.0)->PickPrefill(c, request)->id, "w2");
  // Weight 0 ignores the cache: the shorter queue wins.
  EXPECT_EQ(NewLeastLoadedPolicy(0.0)->PickPrefill(c, request)->id, "w1");
  // A hit smaller than the queue difference does not outweigh it.
  request.cached_tokens["w2"] = 32;
  EXPECT_EQ(NewLeastLoadedPolicy(1.0)->PickPrefill(c, request)->id, "w1");
}

TEST(PrefixIndexTest, DecodeGoesWhereThePromptIsUnlessRoomOutweighsIt) {
  // w1 has 10 more free blocks; w2 holds 6 blocks (96 tokens) of the
  // prompt: 90 + 6 < 100 + 0 with weight 1, so room wins...
  Candidates c = {Both("w1", 0), Both("w2", 0)};
  c[1].load.kv_blocks_free = 90;
  RequestInfo request;
  request.model_id = "m";
  request.prompt_tokens = 100;
  request.max_tokens = 10;
  request.cached_tokens["w2"] = 96;
  EXPECT_EQ(NewLeastLoadedPolicy(1.0)->PickDecode(c, request)->id, "w1");
  // ... and with the difference smaller than the cached blocks, the cache.
  c[1].load.kv_blocks_free = 97;
  EXPECT_EQ(NewLeastLoadedPolicy(1.0)->PickDecode(c, request)->id, "w2");
  // Weight 0 ignores the cache; a heavier weight outweighs more room.
  EXPECT_EQ(NewLeastLoadedPolicy(0.0)->PickDecode(c, request)->id, "w1");
  c[1].load.kv_blocks_free = 90;
  EXPECT_EQ(NewLeastLoadedPolicy(2.0)->PickDecode(c, request)->id, "w2");
}

}  // namespace
}  // namespace baton::coordinator
