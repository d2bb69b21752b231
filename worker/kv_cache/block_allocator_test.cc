// The block allocator's prefix index: publish, match, share, evict, reset,
// and empty + cached + used == total through a randomized workload.
#include "worker/kv_cache/block_allocator.h"

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/prefix_hash.h"

namespace baton {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kBlockSize = 4;

std::vector<int32_t> Ids(const BlockTable& table) {
  return {table.block_ids().begin(), table.block_ids().end()};
}

std::vector<BlockHash> Chain(std::span<const int32_t> tokens) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(PrefixRootHash("test-model"), tokens, kBlockSize, INT64_MAX,
                    &hashes);
  return hashes;
}

void ExpectConsistent(const BlockAllocator& a,
                      const std::vector<const BlockTable*>& tables) {
  EXPECT_EQ(a.num_blocks_empty() + a.num_blocks_cached() + a.num_blocks_used(),
            a.num_blocks_total());
  absl::Status s = a.CheckInvariants(tables);
  EXPECT_TRUE(s.ok()) << s;
}

// Reserves `tokens` in `table`, marks them written and publishes every full
// block, as the engine does after a step.
void FillAndPublish(BlockAllocator& a, BlockTable& table,
                    std::span<const int32_t> tokens) {
  ASSERT_TRUE(a.Reserve(table, static_cast<int64_t>(tokens.size())).ok());
  ASSERT_TRUE(a.SetNumTokens(table, static_cast<int64_t>(tokens.size())).ok());
  std::vector<BlockHash> hashes = Chain(tokens);
  for (size_t i = 0; i < hashes.size(); ++i) {
    a.Publish(table, static_cast<int64_t>(i), hashes[i]);
  }
}

TEST(PrefixHashTest, ChainsDependOnEveryEarlierTokenAndTheRoot) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> b = a;
  b[1] = 99;  // differs in block 0 only
  std::vector<BlockHash> ha = Chain(a);
  std::vector<BlockHash> hb = Chain(b);
  ASSERT_EQ(ha.size(), 2u);  // the partial third block has no hash
  EXPECT_FALSE(ha[0] == hb[0]);
  EXPECT_FALSE(ha[1] == hb[1]);  // same tokens, different parent
  std::vector<BlockHash> other_root;
  ExtendBlockHashes(PrefixRootHash("other-model"), a, kBlockSize, INT64_MAX,
                    &other_root);
  EXPECT_FALSE(ha[0] == other_root[0]);
  // Extending is incremental and capped.
  std::vector<BlockHash> capped;
  ExtendBlockHashes(PrefixRootHash("test-model"), a, kBlockSize, 1, &capped);
  ASSERT_EQ(capped.size(), 1u);
  ExtendBlockHashes(PrefixRootHash("test-model"), a, kBlockSize, 5, &capped);
  EXPECT_EQ(capped, ha);
  // Stable across processes: a fixed input has a fixed hash.
  EXPECT_EQ(PrefixRootHash("").ToHex().size(), 32u);
  EXPECT_EQ(HashBlock(BlockHash{}, std::vector<int32_t>{0, 1, 2, 3}).ToHex(),
            HashBlock(BlockHash{}, std::vector<int32_t>{0, 1, 2, 3}).ToHex());
}

TEST(PrefixHashTest, PackedHashesRoundTripAndBadLengthsAreErrors) {
  const std::vector<BlockHash> hashes = Chain(std::vector<int32_t>(12, 5));
  const std::string packed = PackHashes(hashes);
  EXPECT_EQ(packed.size(), 48u);
  absl::StatusOr<std::vector<BlockHash>> back = UnpackHashes(packed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, hashes);
  EXPECT_EQ(HashFromBytes(packed.substr(0, 16)).ToHex(), hashes[0].ToHex());
  absl::StatusOr<std::vector<BlockHash>> bad = UnpackHashes(packed.substr(1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("47"));
}

TEST(BlockAllocatorTest, FreedPublishedBlocksAreCachedAndShared) {
  BlockAllocator a(8, kBlockSize);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  BlockTable first;
  FillAndPublish(a, first, prompt);  // blocks 0, 1 full; 2 partial
  EXPECT_THAT(Ids(first), ElementsAre(0, 1, 2));
  ExpectConsistent(a, {&first});
  a.Free(first);
  EXPECT_EQ(a.num_blocks_cached(), 2);  // the partial block is empty again
  EXPECT_EQ(a.num_blocks_empty(), 6);
  ExpectConsistent(a, {});

  std::vector<BlockHash> hashes = Chain(prompt);
  ASSERT_EQ(a.MatchPrefix(hashes), 2);
  BlockTable second;
  ASSERT_TRUE(a.CanReserveWithPrefix(hashes, 12));
  a.AcquirePrefix(second, hashes);
  EXPECT_EQ(second.num_tokens(), 8);
  ASSERT_TRUE(a.Reserve(second, 12).ok());
  EXPECT_THAT(Ids(second), ElementsAre(0, 1, 3));
  EXPECT_EQ(a.num_blocks_cached(), 0);
  // A third table shares the same two blocks while the second holds them.
  BlockTable third;
  a.AcquirePrefix(third, std::span<const BlockHash>(hashes).first(1));
  EXPECT_THAT(Ids(third), ElementsAre(0));
  ExpectConsistent(a, {&second, &third});
  a.Free(second);
  a.Free(third);
  EXPECT_EQ(a.num_blocks_cached(), 2);
  ExpectConsistent(a, {});
}

TEST(BlockAllocatorTest, EvictsCachedBlocksOnlyWhenNoEmptyOneIsLeftTailFirst) {
  BlockAllocator a(4, kBlockSize);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  BlockTable t;
  FillAndPublish(a, t, prompt);
  a.Free(t);
  ASSERT_EQ(a.num_blocks_cached(), 2);
  BlockTable other;
  ASSERT_TRUE(a.Reserve(other, 8).ok());  // the two empty blocks
  EXPECT_EQ(a.num_evictions(), 0);
  EXPECT_EQ(a.MatchPrefix(Chain(prompt)), 2);
  ASSERT_TRUE(a.Reserve(other, 12).ok());  // evicts the tail (block 1)
  EXPECT_EQ(a.num_evictions(), 1);
  EXPECT_EQ(a.MatchPrefix(Chain(prompt)), 1);
  EXPECT_FALSE(a.CanReserve(other, 20));
  EXPECT_EQ(a.Reserve(other, 20).code(), absl::StatusCode::kResourceExhausted);
  ExpectConsistent(a, {&other});
  // The last cached block is taken by a prefix acquire, so it cannot be
  // counted as evictable for the same admission.
  std::vector<BlockHash> one = {Chain(prompt)[0]};
  EXPECT_TRUE(a.CanReserveWithPrefix(one, 4));
  EXPECT_FALSE(a.CanReserveWithPrefix(one, 5));
  a.Free(other);
  ExpectConsistent(a, {});
}

TEST(BlockAllocatorTest, PublishKeepsTheFirstBlockForAHash) {
  BlockAllocator a(8, kBlockSize);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  BlockTable x, y;
  FillAndPublish(a, x, prompt);
  ASSERT_TRUE(a.Reserve(y, 4).ok());
  ASSERT_TRUE(a.SetNumTokens(y, 4).ok());
  EXPECT_FALSE(a.Publish(y, 0, Chain(prompt)[0]));  // x's block has it
  EXPECT_FALSE(a.Publish(x, 0, Chain(prompt)[0]));  // already published
  a.Free(y);
  EXPECT_EQ(a.num_blocks_cached(), 0);  // y's copy was never published
  a.Free(x);
  EXPECT_EQ(a.num_blocks_cached(), 1);
  EXPECT_EQ(a.ResetPrefixCache(), 1);
  EXPECT_EQ(a.num_blocks_cached(), 0);
  EXPECT_EQ(a.MatchPrefix(Chain(prompt)), 0);
  ExpectConsistent(a, {});
}

TEST(BlockAllocatorTest, ResetUnpublishesHeldBlocksWithoutFreeingThem) {
  BlockAllocator a(4, kBlockSize);
  BlockTable t;
  FillAndPublish(a, t, std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_EQ(a.ResetPrefixCache(), 1);
  EXPECT_EQ(a.num_blocks_used(), 1);
  ExpectConsistent(a, {&t});
  a.Free(t);
  EXPECT_EQ(a.num_blocks_empty(), 4);
  ExpectConsistent(a, {});
}

TEST(BlockAllocatorTest, EventsFollowPublishEvictAndReset) {
  BlockAllocator a(2, kBlockSize);
  a.set_event_log_capacity(3);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<BlockHash> hashes = Chain(prompt);
  BlockTable t;
  FillAndPublish(a, t, prompt);
  a.Free(t);
  EXPECT_EQ(a.last_event_seq(), 2u);
  std::vector<KvCacheEvent> events;
  ASSERT_TRUE(a.EventsSince(0, 10, &events));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].stored && events[0].hash == hashes[0]);
  EXPECT_TRUE(events[1].stored && events[1].hash == hashes[1]);
  BlockTable other;
  ASSERT_TRUE(a.Reserve(other, 4).ok());  // evicts block 1 (the tail)
  events.clear();
  ASSERT_TRUE(a.EventsSince(2, 10, &events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq, 3u);
  EXPECT_FALSE(events[0].stored);
  EXPECT_TRUE(events[0].hash == hashes[1]);
  EXPECT_EQ(a.PublishedHashes(), std::vector<BlockHash>{hashes[0]});
  a.ResetPrefixCache();
  a.Free(other);
  events.clear();
  ASSERT_TRUE(a.EventsSince(3, 1, &events));  // at most one
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].stored);
  // Event 1 fell out of a log of 3: the reader must start over.
  EXPECT_FALSE(a.EventsSince(0, 10, &events));
  EXPECT_TRUE(a.PublishedHashes().empty());
}

// Random reserve / publish / acquire / free / reset over a small pool with
// few distinct prompts: the accounting and the ownership hold after each.
TEST(BlockAllocatorTest, RandomWorkloadKeepsAccountingExact) {
  BlockAllocator a(24, kBlockSize);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 6; ++p) {
    std::vector<int32_t> tokens(static_cast<size_t>(3 + 5 * p));
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(i < 8 ? i : i * (p + 1));
    }
    prompts.push_back(tokens);
  }
  std::vector<BlockTable> live(8);
  for (int step = 0; step < 3000; ++step) {
    BlockTable& t = live[rng() % live.size()];
    const std::vector<int32_t>& prompt = prompts[rng() % prompts.size()];
    const int op = static_cast<int>(rng() % 10);
    if (op == 0) {
      a.ResetPrefixCache();
    } else if (!t.empty()) {
      a.Free(t);
    } else {
      std::vector<BlockHash> hashes = Chain(prompt);
      hashes.resize(static_cast<size_t>(std::min<int64_t>(
          a.MatchPrefix(hashes),
          (static_cast<int64_t>(prompt.size()) - 1) / kBlockSize)));
      const int64_t total = static_cast<int64_t>(prompt.size());
      if (!a.CanReserveWithPrefix(hashes, total)) continue;
      a.AcquirePrefix(t, hashes);
      ASSERT_TRUE(a.Reserve(t, total).ok());
      ASSERT_TRUE(a.SetNumTokens(t, total).ok());
      std::vector<BlockHash> all = Chain(prompt);
      for (size_t i = 0; i < all.size(); ++i) {
        a.Publish(t, static_cast<int64_t>(i), all[i]);
      }
    }
    std::vector<const BlockTable*> tables;
    for (const BlockTable& l : live) tables.push_back(&l);
    ASSERT_TRUE(a.CheckInvariants(tables).ok())
        << "step " << step << ": " << a.CheckInvariants(tables);
  }
  for (BlockTable& t : live) a.Free(t);
  ExpectConsistent(a, {});
  EXPECT_GT(a.num_evictions(), 0);
}

}  // namespace
}  // namespace baton
