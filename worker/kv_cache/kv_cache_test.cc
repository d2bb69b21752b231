// Allocation, accounting and options of KvCache.
#include "worker/kv_cache/kv_cache.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvCacheOptions SmallOptions(int64_t num_blocks) {
  KvCacheOptions options;
  options.num_layers = 2;
  options.num_kv_heads = 2;
  options.head_dim = 8;
  options.block_size = 4;
  options.num_blocks = num_blocks;
  return options;
}

std::unique_ptr<KvCache> MakeCache(const KvCacheOptions& options) {
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

std::vector<int32_t> Ids(const BlockTable& table) {
  return {table.block_ids().begin(), table.block_ids().end()};
}

// free + used == total, internal invariants, and exact ownership by `tables`.
void ExpectConsistent(const KvCache& cache,
                      const std::vector<const BlockTable*>& tables) {
  EXPECT_EQ(cache.num_blocks_free() + cache.num_blocks_used(),
            cache.num_blocks_total());
  EXPECT_TRUE(cache.CheckInvariants().ok()) << cache.CheckInvariants();
  absl::Status owned = cache.CheckInvariants(tables);
  EXPECT_TRUE(owned.ok()) << owned;
}

TEST(KvCacheTest, FreshPoolGeometry) {
  KvCacheOptions options;
  options.num_layers = 30;
  options.num_kv_heads = 3;
  options.head_dim = 64;
  options.num_blocks = 10;
  std::unique_ptr<KvCache> cache = MakeCache(options);
  ASSERT_NE(cache, nullptr);
  // 2 (K, V) x 3 heads x 16 tokens x 64 dims x 2 bytes.
  EXPECT_EQ(cache->chunk_bytes(), 12288u);
  EXPECT_EQ(cache->pool_bytes(), 30u * 10u * 12288u);
  EXPECT_EQ(cache->num_blocks_total(), 10);
  EXPECT_EQ(cache->num_blocks_free(), 10);
  EXPECT_EQ(cache->num_blocks_used(), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cache->LayerBlock(0, 0)) %
                KvPoolMemory::kAlignment,
            0u);
  EXPECT_EQ(cache->LayerBlock(1, 0) - cache->LayerBlock(0, 0), 10 * 12288);
  EXPECT_EQ(cache->LayerBlock(0, 3) - cache->LayerBlock(0, 0), 3 * 12288);
  ExpectConsistent(*cache, {});
}

TEST(KvCacheTest, BlocksNeededRoundsUp) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(8));
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->BlocksNeeded(0), 0);
  EXPECT_EQ(cache->BlocksNeeded(1), 1);
  EXPECT_EQ(cache->BlocksNeeded(4), 1);
  EXPECT_EQ(cache->BlocksNeeded(5), 2);
  EXPECT_EQ(cache->BlocksNeeded(std::numeric_limits<int64_t>::max()),
            std::numeric_limits<int64_t>::max() / 4 + 1);
}

TEST(KvCacheTest, ReserveGrowsNeverShrinksAndFreeIsIdempotent) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(8));
  ASSERT_NE(cache, nullptr);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 1).ok());
  EXPECT_THAT(Ids(table), ElementsAre(0));
  ASSERT_TRUE(cache->Reserve(table, 9).ok());
  EXPECT_THAT(Ids(table), ElementsAre(0, 1, 2));
  ASSERT_TRUE(cache->Reserve(table, 2).ok());
  EXPECT_THAT(Ids(table), ElementsAre(0, 1, 2));
  EXPECT_EQ(cache->Capacity(table), 12);
  EXPECT_EQ(cache->num_blocks_used(), 3);
  ExpectConsistent(*cache, {&table});

  EXPECT_TRUE(cache->SetNumTokens(table, 12).ok());
  EXPECT_EQ(table.num_tokens(), 12);
  absl::Status too_many = cache->SetNumTokens(table, 13);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.message(), HasSubstr("[0, 12]"));
  EXPECT_EQ(cache->Reserve(table, -1).code(),
            absl::StatusCode::kInvalidArgument);

  cache->Free(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(cache->num_blocks_free(), 8);
  cache->Free(table);
  EXPECT_EQ(cache->num_blocks_free(), 8);
  ExpectConsistent(*cache, {&table});
}

TEST(KvCacheTest, FreeListIsFifo) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(10));
  ASSERT_NE(cache, nullptr);
  BlockTable a, b, c;
  ASSERT_TRUE(cache->Reserve(a, 12).ok());
  ASSERT_TRUE(cache->Reserve(b, 8).ok());
  EXPECT_THAT(Ids(a), ElementsAre(0, 1, 2));
  EXPECT_THAT(Ids(b), ElementsAre(3, 4));
  cache->Free(a);
  // Free list is now 5..9 then 0, 1, 2.
  ASSERT_TRUE(cache->Reserve(c, 28).ok());
  EXPECT_THAT(Ids(c), ElementsAre(5, 6, 7, 8, 9, 0, 1));
  ExpectConsistent(*cache, {&a, &b, &c});
  cache->Free(b);
  cache->Free(c);
  ExpectConsistent(*cache, {});
}

TEST(KvCacheTest, ReserveFailureLeavesStateUnchanged) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(6));
  ASSERT_NE(cache, nullptr);
  BlockTable a, b;
  ASSERT_TRUE(cache->Reserve(a, 16).ok());  // 4 blocks
  ASSERT_TRUE(cache->Reserve(b, 3).ok());   // 1 block
  ASSERT_TRUE(cache->SetNumTokens(b, 3).ok());
  const std::vector<int32_t> before = Ids(b);

  EXPECT_FALSE(cache->CanReserve(b, 13));
  absl::Status full = cache->Reserve(b, 13);  // needs 3 more, 1 free
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("13 tokens need 3 more blocks"));
  EXPECT_THAT(full.message(), HasSubstr("1 of 6 blocks free"));
  EXPECT_EQ(Ids(b), before);
  EXPECT_EQ(b.num_tokens(), 3);
  EXPECT_EQ(cache->num_blocks_free(), 1);
  ExpectConsistent(*cache, {&a, &b});

  absl::Status never = cache->Reserve(b, 100);
  EXPECT_EQ(never.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(never.message(), HasSubstr("exceeds the whole pool"));

  // The failed calls consumed nothing: the next block is the one a fresh
  // pool in the same state would give.
  EXPECT_TRUE(cache->CanReserve(b, 8));
  ASSERT_TRUE(cache->Reserve(b, 8).ok());
  EXPECT_THAT(Ids(b), ElementsAre(4, 5));
  cache->Free(a);
  cache->Free(b);
  ExpectConsistent(*cache, {});
}

// Drives a seeded random workload of new / grow / free; returns every
// successful reservation's block ids in order.
std::vector<std::vector<int32_t>> RandomWorkload(KvCache& cache, uint32_t seed,
                                                 int64_t* exhaustions) {
  std::mt19937 rng(seed);
  std::vector<BlockTable> tables;
  std::vector<std::vector<int32_t>> history;
  *exhaustions = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 4 || tables.empty()) {  // new sequence
      BlockTable table;
      const int64_t tokens =
          std::uniform_int_distribution<int64_t>(1, 200)(rng);
      const bool can = cache.CanReserve(table, tokens);
      absl::Status s = cache.Reserve(table, tokens);
      EXPECT_EQ(can, s.ok()) << s;
      if (s.ok()) {
        history.push_back(Ids(table));
        tables.push_back(std::move(table));
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
        EXPECT_TRUE(table.empty());
        ++*exhaustions;
      }
    } else if (op < 8) {  // grow
      BlockTable& table = tables[std::uniform_int_distribution<size_t>(
          0, tables.size() - 1)(rng)];
      const std::vector<int32_t> before = Ids(table);
      const int64_t free_before = cache.num_blocks_free();
      const int64_t tokens = cache.Capacity(table) +
                             std::uniform_int_distribution<int64_t>(1, 64)(rng);
      absl::Status s = cache.Reserve(table, tokens);
      if (s.ok()) {
        EXPECT_GE(cache.Capacity(table), tokens);
        EXPECT_TRUE(cache.SetNumTokens(table, tokens).ok());
        history.push_back(Ids(table));
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
        EXPECT_EQ(Ids(table), before);
        EXPECT_EQ(cache.num_blocks_free(), free_before);
        ++*exhaustions;
      }
    } else {  // free
      const size_t i =
          std::uniform_int_distribution<size_t>(0, tables.size() - 1)(rng);
      cache.Free(tables[i]);
      tables.erase(tables.begin() + static_cast<ptrdiff_t>(i));
    }
    int64_t held = 0;
    std::vector<const BlockTable*> live;
    for (const BlockTable& t : tables) {
      held += t.num_blocks();
      live.push_back(&t);
    }
    EXPECT_EQ(cache.num_blocks_used(), held);
    if (step % 50 == 0) ExpectConsistent(cache, live);
  }
  for (BlockTable& t : tables) cache.Free(t);
  return history;
}

TEST(KvCacheTest, RandomWorkloadUntilExhaustionIsConsistentAndDeterministic) {
  std::unique_ptr<KvCache> first = MakeCache(SmallOptions(300));
  std::unique_ptr<KvCache> second = MakeCache(SmallOptions(300));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  int64_t exhaustions_first = 0, exhaustions_second = 0;
  std::vector<std::vector<int32_t>> a =
      RandomWorkload(*first, 1234, &exhaustions_first);
  std::vector<std::vector<int32_t>> b =
      RandomWorkload(*second, 1234, &exhaustions_second);
  EXPECT_GT(exhaustions_first, 0) << "the workload never filled the pool";
  EXPECT_GT(a.size(), 100u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(exhaustions_first, exhaustions_second);
  EXPECT_EQ(first->num_blocks_free(), first->num_blocks_total());
  ExpectConsistent(*first, {});
  ExpectConsistent(*second, {});
}

TEST(KvCacheTest, OwnershipCheckCatchesLeakAndMoves) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(8));
  ASSERT_NE(cache, nullptr);
  BlockTable a;
  ASSERT_TRUE(cache->Reserve(a, 5).ok());
  ASSERT_TRUE(cache->SetNumTokens(a, 5).ok());
  BlockTable b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.num_tokens(), 0);
  EXPECT_THAT(Ids(b), ElementsAre(0, 1));
  EXPECT_EQ(b.num_tokens(), 5);
  BlockTable c;
  c = std::move(b);
  EXPECT_THAT(Ids(c), ElementsAre(0, 1));
  ExpectConsistent(*cache, {&a, &b, &c});
  // Forgetting a live table shows up as a leak.
  absl::Status leak = cache->CheckInvariants({});
  EXPECT_EQ(leak.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(leak.message(), HasSubstr("live tables hold it 0 times"));
  cache->Free(c);
  ExpectConsistent(*cache, {&c});
}

TEST(KvCacheTest, OptionsValidation) {
  struct Case {
    void (*mutate)(KvCacheOptions&);
    const char* message;
  };
  const Case cases[] = {
      {[](KvCacheOptions& o) { o.num_layers = 0; },
       "num_layers must be in [1, 1024], got 0"},
      {[](KvCacheOptions& o) { o.num_layers = 1025; },
       "num_layers must be in [1, 1024], got 1025"},
      {[](KvCacheOptions& o) { o.num_kv_heads = -3; },
       "num_kv_heads must be in [1, 1024], got -3"},
      {[](KvCacheOptions& o) { o.head_dim = 0; },
       "head_dim must be in [1, 1024], got 0"},
      {[](KvCacheOptions& o) { o.block_size = 0; },
       "block_size must be in [1, 1024], got 0"},
      {[](KvCacheOptions& o) { o.block_size = 4096; },
       "block_size must be in [1, 1024], got 4096"},
      {[](KvCacheOptions& o) { o.dtype = DType::kQ4_0; },
       "dtype must be F16 or F32, got ggml type id 2"},
      {[](KvCacheOptions& o) { o.num_blocks = 0; },
       "set exactly one of num_blocks and max_bytes"},
      {[](KvCacheOptions& o) { o.max_bytes = 1 << 20; },
       "set exactly one of num_blocks and max_bytes"},
      {[](KvCacheOptions& o) { o.num_blocks = -5; },
       "num_blocks must be in [1, 2147483647], got -5"},
      {[](KvCacheOptions& o) { o.num_blocks = int64_t{1} << 31; },
       "num_blocks must be in [1, 2147483647]"},
      {[](KvCacheOptions& o) {
         o.num_blocks = 0;
         o.max_bytes = 100;
       },
       "max_bytes=100 is below one block"},
  };
  for (const Case& c : cases) {
    KvCacheOptions options = SmallOptions(8);
    c.mutate(options);
    absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(options);
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(cache.status().message(), HasSubstr(c.message));
  }
  KvCacheOptions f32 = SmallOptions(8);
  f32.dtype = DType::kF32;
  std::unique_ptr<KvCache> cache = MakeCache(f32);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->chunk_bytes(), 2u * 2u * 4u * 8u * 4u);
}

TEST(KvCacheTest, ByteBudgetSizing) {
  KvCacheOptions options = SmallOptions(0);
  // One block across both layers: 2 layers x 256-byte chunks.
  const uint64_t per_block = 2 * (2 * 2 * 4 * 8 * 2);
  options.max_bytes = 37 * per_block + per_block - 1;
  std::unique_ptr<KvCache> cache = MakeCache(options);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->num_blocks_total(), 37);
  EXPECT_EQ(cache->pool_bytes(), 37 * per_block);
  EXPECT_LE(cache->pool_bytes(), options.max_bytes);
  options.max_bytes = per_block;
  options.prefault = true;
  cache = MakeCache(options);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->num_blocks_total(), 1);
  ExpectConsistent(*cache, {});
}

TEST(KvCacheTest, UnallocatablePoolIsResourceExhausted) {
  KvCacheOptions options;
  options.num_layers = 1024;
  options.num_kv_heads = 8;
  options.head_dim = 128;
  options.dtype = DType::kF32;
  options.num_blocks = std::numeric_limits<int32_t>::max();
  // 2^31 - 1 blocks x 1024 layers x 128 KiB: about 2^58 bytes.
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(options);
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(cache.status().message(), HasSubstr("288230376017494016 bytes"));

  options.num_kv_heads = 1024;
  options.head_dim = 1024;
  options.block_size = 1024;
  cache = KvCache::Create(options);
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(cache.status().message(), HasSubstr("overflows 64 bits"));
}

// The allocator of a pool whose bytes live on a device: same accounting,
// nothing mapped (a pool far beyond this host's memory is fine), and no way
// to touch bytes that are not there (LayerBlock and the data calls fail a
// check).
TEST(KvCacheTest, WithoutHostStorageOnlyTheAllocatorRemains) {
  KvCacheOptions options;
  options.num_layers = 32;
  options.num_kv_heads = 8;
  options.head_dim = 128;
  options.max_bytes = uint64_t{1} << 40;  // 1 TiB of KV
  options.host_storage = false;
  std::unique_ptr<KvCache> cache = MakeCache(options);
  ASSERT_NE(cache, nullptr);
  EXPECT_FALSE(cache->has_host_storage());
  EXPECT_EQ(cache->pool_bytes(),
            static_cast<uint64_t>(cache->num_blocks_total()) * 32u *
                cache->chunk_bytes());
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 1000).ok());
  EXPECT_EQ(cache->num_blocks_used(), cache->BlocksNeeded(1000));
  ExpectConsistent(*cache, {&table});
  cache->Free(table);
  ExpectConsistent(*cache, {});

  // Dropped after creation: the same, with the allocation state kept.
  std::unique_ptr<KvCache> dropped = MakeCache(SmallOptions(8));
  ASSERT_NE(dropped, nullptr);
  ASSERT_TRUE(dropped->has_host_storage());
  ASSERT_TRUE(dropped->Reserve(table, 20).ok());
  dropped->DropHostStorage();
  EXPECT_FALSE(dropped->has_host_storage());
  EXPECT_EQ(dropped->num_blocks_used(), dropped->BlocksNeeded(20));
  dropped->Free(table);
  ExpectConsistent(*dropped, {});
}

TEST(KvCacheTest, LayerChunksAreTheExportedBytesInTableOrder) {
  std::unique_ptr<KvCache> cache = MakeCache(SmallOptions(12));
  ASSERT_NE(cache, nullptr);
  // Fragment the free list so the table's block ids are out of order.
  std::vector<BlockTable> singles(12);
  for (BlockTable& t : singles) ASSERT_TRUE(cache->Reserve(t, 1).ok());
  for (int i : {7, 2, 11, 0, 5, 9, 3, 1, 10, 4, 6, 8}) cache->Free(singles[i]);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(table, 18).ok());  // 5 blocks of 4
  EXPECT_THAT(Ids(table), ElementsAre(7, 2, 11, 0, 5));
  ASSERT_TRUE(cache->SetNumTokens(table, 14).ok());  // 4 blocks written
  std::mt19937 rng(5);
  const uint64_t chunk = cache->chunk_bytes();
  for (int64_t l = 0; l < 2; ++l) {
    absl::StatusOr<std::vector<std::span<uint8_t>>> out =
        cache->MutableLayerChunks(table, l, 14);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 4u);
    for (size_t i = 0; i < out->size(); ++i) {
      EXPECT_EQ((*out)[i].data(), cache->LayerBlock(l, table.block_ids()[i]));
      EXPECT_EQ((*out)[i].size(), chunk);
      for (uint8_t& b : (*out)[i]) b = static_cast<uint8_t>(rng());
    }
    absl::StatusOr<std::vector<std::span<const uint8_t>>> in =
        cache->LayerChunks(table, l, 14);
    ASSERT_TRUE(in.ok()) << in.status();
    std::vector<uint8_t> joined;
    for (std::span<const uint8_t> c : *in) {
      joined.insert(joined.end(), c.begin(), c.end());
    }
    std::vector<uint8_t> exported(cache->LayerBytes(table));
    ASSERT_TRUE(cache->ExportLayer(table, l, exported).ok());
    EXPECT_EQ(joined, exported);
  }
  // The whole reserved capacity may be listed; no more.
  EXPECT_EQ(cache->LayerChunks(table, 0, 20)->size(), 5u);
  EXPECT_EQ(cache->LayerChunks(table, 0, 0)->size(), 0u);
  absl::Status s = cache->LayerChunks(table, 0, 21).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_tokens must be in [0, 20]"));
  s = cache->MutableLayerChunks(table, 2, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer must be in [0, 2), got 2"));
  cache->Free(table);
  for (BlockTable& t : singles) cache->Free(t);
  ExpectConsistent(*cache, {});
}

}  // namespace
}  // namespace baton
