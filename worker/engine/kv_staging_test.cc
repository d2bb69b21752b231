// KvStagingPool: areas of exactly the requested blocks from the pool while
// it has room, of their own beyond it, every block back when an area goes.
#include "worker/engine/kv_staging.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

KvCacheOptions Options(int64_t num_blocks) {
  return KvCacheOptionsFor(KvLayout{.num_layers = 3,
                                    .num_kv_heads = 2,
                                    .head_dim = 8,
                                    .block_size = 4,
                                    .dtype = DType::kF16},
                           num_blocks);
}

TEST(KvStagingPoolTest, PoolWhileItHasRoomThenAreasOfTheirOwn) {
  auto pool = KvCache::Create(Options(5));
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvStagingPool staging(pool->get(), (*pool)->layout());
  std::vector<std::unique_ptr<StagedKv>> areas;
  for (int64_t blocks : {2, 3, 1, 4}) {
    auto area = staging.Acquire(blocks);
    ASSERT_TRUE(area.ok()) << area.status();
    EXPECT_EQ((*area)->num_blocks(), blocks);
    areas.push_back(std::move(*area));
  }
  // 2 + 3 filled the pool; 1 and 4 staged on their own.
  EXPECT_TRUE(areas[0]->pooled());
  EXPECT_TRUE(areas[1]->pooled());
  EXPECT_FALSE(areas[2]->pooled());
  EXPECT_FALSE(areas[3]->pooled());
  EXPECT_EQ(areas[2]->mutex(), nullptr);
  EXPECT_NE(areas[0]->mutex(), nullptr);
  EXPECT_EQ(staging.pooled_areas(), 2);
  EXPECT_EQ(staging.own_areas(), 2);
  EXPECT_EQ(staging.pool_blocks_used(), 5);
  // Every area's bytes are writable, one layer after another.
  for (const auto& area : areas) {
    for (int64_t l = 0; l < 3; ++l) {
      for (int32_t b : area->table().block_ids()) {
        std::memset(area->cache().LayerBlock(l, b), 0x5A,
                    area->cache().chunk_bytes());
      }
    }
  }
  areas.erase(areas.begin() + 1);  // 3 pool blocks back
  EXPECT_EQ(staging.pool_blocks_used(), 2);
  auto again = staging.Acquire(3);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->pooled());
  again->reset();
  areas.clear();
  EXPECT_EQ(staging.pool_blocks_used(), 0);
  EXPECT_TRUE((*pool)->CheckInvariants().ok());
}

TEST(KvStagingPoolTest, WithoutAPoolEveryAreaIsItsOwn) {
  auto layout = KvCache::Create(Options(1));
  ASSERT_TRUE(layout.ok());
  KvStagingPool staging(nullptr, (*layout)->layout());
  auto area = staging.Acquire(7);
  ASSERT_TRUE(area.ok()) << area.status();
  EXPECT_FALSE((*area)->pooled());
  EXPECT_EQ((*area)->num_blocks(), 7);
  EXPECT_EQ((*area)->cache().num_blocks_total(), 7);
  EXPECT_EQ(staging.pool_blocks_used(), 0);
  EXPECT_EQ(staging.own_areas(), 1);
}

TEST(KvStagingPoolTest, BadCountIsInvalidArgument) {
  auto pool = KvCache::Create(Options(4));
  ASSERT_TRUE(pool.ok());
  KvStagingPool staging(pool->get(), (*pool)->layout());
  for (int64_t blocks : {0, -1}) {
    auto area = staging.Acquire(blocks);
    EXPECT_EQ(area.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(area.status().message(), HasSubstr("at least 1"));
  }
}

}  // namespace
}  // namespace baton
