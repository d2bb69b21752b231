// The host half of the CUDA-graph decode path: buckets, context tiers,
// eligibility and the fixed-layout metadata of a padded batch, against
// BuildForwardPlan's packing of the same items. Runs everywhere (no device).
#include "worker/cuda/decode_graph_plan.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/forward_plan.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

TEST(DecodeGraphPlanTest, BucketsRoundUpAndClampToTheLimit) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {1, 1},   {2, 2},   {3, 4},   {4, 4},   {5, 8},   {8, 8},
      {9, 16},  {16, 16}, {17, 24}, {25, 32}, {32, 32}, {33, 48},
      {48, 48}, {49, 64}, {63, 64}, {64, 64}};
  for (const auto& [n, bucket] : cases) {
    EXPECT_EQ(DecodeGraphBucket(n, 64), bucket) << "n " << n;
  }
  EXPECT_EQ(DecodeGraphBucket(0, 64), 0);
  EXPECT_EQ(DecodeGraphBucket(65, 64), 0);
  EXPECT_EQ(DecodeGraphBucket(-1, 64), 0);
  EXPECT_EQ(DecodeGraphBucket(49, 50), 50);
  EXPECT_EQ(DecodeGraphBucket(3, 3), 3);
  EXPECT_EQ(DecodeGraphBucket(129, 512), 160);
  EXPECT_THAT(DecodeGraphBuckets(64),
              ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64));
  EXPECT_THAT(DecodeGraphBuckets(200),
              ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160,
                          192, 200));
  EXPECT_THAT(DecodeGraphBuckets(3), ElementsAre(1, 2, 3));
  EXPECT_TRUE(DecodeGraphBuckets(0).empty());
}

// Every n of every limit up to 300 lands in a listed bucket >= n, with less
// than half padding (less than a third from bucket 24 on).
TEST(DecodeGraphPlanTest, EveryBatchHasABoundedBucket) {
  for (int64_t max = 1; max <= 300; ++max) {
    const std::vector<int64_t> buckets = DecodeGraphBuckets(max);
    ASSERT_FALSE(buckets.empty());
    EXPECT_EQ(buckets.back(), max);
    for (int64_t n = 1; n <= max; ++n) {
      const int64_t b = DecodeGraphBucket(n, max);
      ASSERT_GE(b, n) << "max " << max << " n " << n;
      ASSERT_LE(b, max);
      ASSERT_TRUE(std::binary_search(buckets.begin(), buckets.end(), b))
          << "max " << max << " n " << n << " bucket " << b;
      ASSERT_LT(2 * (b - n), b) << "max " << max << " n " << n;
      if (b >= 24) {
        ASSERT_LT(3 * (b - n), b) << "max " << max << " n " << n;
      }
    }
  }
}

TEST(DecodeGraphPlanTest, ContextBoundIsTheSmallestCoveringTier) {
  EXPECT_EQ(DecodeGraphContextBound(1, 8192), 256);
  EXPECT_EQ(DecodeGraphContextBound(256, 8192), 256);
  EXPECT_EQ(DecodeGraphContextBound(257, 8192), 1024);
  EXPECT_EQ(DecodeGraphContextBound(1025, 8192), 4096);
  EXPECT_EQ(DecodeGraphContextBound(4096, 8192), 4096);
  EXPECT_EQ(DecodeGraphContextBound(4097, 8192), 8192);
  EXPECT_EQ(DecodeGraphContextBound(8192, 8192), 8192);
  // Tiers at or above the context length are the context length itself.
  EXPECT_EQ(DecodeGraphContextBound(5, 200), 200);
  EXPECT_EQ(DecodeGraphContextBound(5, 256), 256);
  EXPECT_EQ(DecodeGraphContextBound(300, 1000), 1000);
  EXPECT_EQ(DecodeGraphContextBound(100, 1000), 256);
  EXPECT_EQ(DecodeGraphContextBound(2000, 2048), 2048);
}

TEST(DecodeGraphPlanTest, LayoutIsFixedPerBucket) {
  const DecodeGraphLayout l = MakeDecodeGraphLayout(4, 3);
  EXPECT_EQ(l.offsets.token_ids, 0);
  EXPECT_EQ(l.offsets.positions, 4);
  EXPECT_EQ(l.offsets.token_blocks, 8);
  EXPECT_EQ(l.offsets.cu_seqlens, 12);
  EXPECT_EQ(l.offsets.start_pos, 17);
  EXPECT_EQ(l.offsets.context_lens, 21);
  EXPECT_EQ(l.offsets.row_offsets, 25);
  EXPECT_EQ(l.offsets.logit_rows, 30);
  EXPECT_EQ(l.offsets.block_ids, 34);
  EXPECT_EQ(l.total, 34 + 4 * 3);
  // A larger bucket's layout is larger: one buffer serves every bucket.
  EXPECT_LT(MakeDecodeGraphLayout(48, 512).total,
            MakeDecodeGraphLayout(64, 512).total);
}

constexpr int64_t kBlockSize = 4;
constexpr int64_t kContext = 64;  // 16 blocks per sequence at most

class DecodeGraphPackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvCacheOptions options;
    options.num_layers = 1;
    options.num_kv_heads = 1;
    options.head_dim = 8;
    options.block_size = kBlockSize;
    options.num_blocks = 200;
    auto cache = KvCache::Create(options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }
  void TearDown() override {
    for (BlockTable& t : tables_) cache_->Free(t);
  }

  // One decode item per entry, `cached` tokens already in its table.
  std::vector<ForwardItem> Items(const std::vector<int64_t>& cached) {
    std::mt19937 rng(7);
    std::vector<ForwardItem> items;
    for (int64_t c : cached) {
      tables_.emplace_back();
      BlockTable& t = tables_.back();
      EXPECT_TRUE(cache_->Reserve(t, c + 1).ok());
      EXPECT_TRUE(cache_->SetNumTokens(t, c).ok());
      tokens_.push_back({static_cast<int32_t>(rng() % 100)});
      items.push_back({&t, c, tokens_.back(), LogitsMode::kLast});
    }
    return items;
  }

  ForwardLimits Limits() const {
    ForwardLimits limits;
    limits.vocab_size = 100;
    limits.context_length = kContext;
    limits.block_size = kBlockSize;
    limits.num_blocks = 200;
    limits.max_batch_tokens = 64;
    return limits;
  }

  std::unique_ptr<KvCache> cache_;
  std::deque<BlockTable> tables_;
  std::deque<std::vector<int32_t>> tokens_;
};

TEST_F(DecodeGraphPackTest, EligibilityNeedsOneTokenLastLogitsNoCallback) {
  std::vector<ForwardItem> items = Items({3, 10, 0});
  EXPECT_TRUE(DecodeGraphEligible(items, false, 64));
  EXPECT_FALSE(DecodeGraphEligible(items, true, 64));
  EXPECT_FALSE(DecodeGraphEligible(items, false, 2));
  EXPECT_TRUE(DecodeGraphEligible(items, false, 3));
  EXPECT_FALSE(DecodeGraphEligible({}, false, 64));
  for (LogitsMode mode : {LogitsMode::kAll, LogitsMode::kNone}) {
    std::vector<ForwardItem> other = items;
    other[1].logits = mode;
    EXPECT_FALSE(DecodeGraphEligible(other, false, 64));
  }
  const std::vector<int32_t> two = {1, 2};
  std::vector<ForwardItem> longer = items;
  longer[2].tokens = two;
  EXPECT_FALSE(DecodeGraphEligible(longer, false, 64));
}

// The real rows are BuildForwardPlan's arrays; padding rows are token 0 at
// position 0, block -1, context 0, empty table and query range.
TEST_F(DecodeGraphPackTest, PaddedBatchMatchesTheEagerPlanPlusPadding) {
  const std::vector<ForwardItem> items = Items({3, 17, 0, 63, 8});
  ASSERT_TRUE(ValidateForwardItems(items, Limits()).ok());
  ForwardPlan plan;
  BuildForwardPlan(items, kBlockSize, &plan);
  const int64_t n = 5, bucket = DecodeGraphBucket(n, 64);
  ASSERT_EQ(bucket, 8);
  const DecodeGraphLayout layout =
      MakeDecodeGraphLayout(bucket, kContext / kBlockSize);
  constexpr int32_t kPoison = -12345;
  std::vector<int32_t> out(layout.total, kPoison);
  const DecodeGraphPacked packed =
      PackDecodeGraphStep(items, kBlockSize, layout, out);
  EXPECT_EQ(packed.max_context_len, 64);
  const int64_t blocks = 1 + 5 + 1 + 16 + 3;
  EXPECT_EQ(packed.used, layout.offsets.block_ids + blocks);
  for (int64_t i = 0; i < packed.used; ++i) {
    ASSERT_NE(out[i], kPoison) << "element " << i << " not written";
  }
  const ForwardPlanOffsets& e = plan.offsets;
  const ForwardPlanOffsets& g = layout.offsets;
  auto eager = [&](int64_t offset, int64_t count) {
    return std::vector<int32_t>(plan.packed.begin() + offset,
                                plan.packed.begin() + offset + count);
  };
  auto graph = [&](int64_t offset, int64_t count) {
    return std::vector<int32_t>(out.begin() + offset,
                                out.begin() + offset + count);
  };
  EXPECT_EQ(graph(g.token_ids, n), eager(e.token_ids, n));
  EXPECT_EQ(graph(g.positions, n), eager(e.positions, n));
  EXPECT_EQ(graph(g.token_blocks, n), eager(e.token_blocks, n));
  EXPECT_EQ(graph(g.cu_seqlens, n + 1), eager(e.cu_seqlens, n + 1));
  EXPECT_EQ(graph(g.start_pos, n), eager(e.start_pos, n));
  EXPECT_EQ(graph(g.context_lens, n), eager(e.context_lens, n));
  EXPECT_EQ(graph(g.row_offsets, n + 1), eager(e.row_offsets, n + 1));
  EXPECT_EQ(graph(g.logit_rows, n), eager(e.logit_rows, n));
  EXPECT_EQ(graph(g.block_ids, blocks), eager(e.block_ids, blocks));
  const int32_t b = static_cast<int32_t>(blocks);
  EXPECT_THAT(graph(g.token_ids + n, 3), ElementsAre(0, 0, 0));
  EXPECT_THAT(graph(g.positions + n, 3), ElementsAre(0, 0, 0));
  EXPECT_THAT(graph(g.token_blocks + n, 3), ElementsAre(-1, -1, -1));
  EXPECT_THAT(graph(g.cu_seqlens + n, 4), ElementsAre(5, 5, 5, 5));
  EXPECT_THAT(graph(g.start_pos + n, 3), ElementsAre(0, 0, 0));
  EXPECT_THAT(graph(g.context_lens + n, 3), ElementsAre(0, 0, 0));
  EXPECT_THAT(graph(g.row_offsets + n, 4), ElementsAre(b, b, b, b));
  EXPECT_THAT(graph(g.logit_rows, bucket), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  // The unused tail of block_ids is not part of the upload.
  EXPECT_EQ(out[packed.used], kPoison);
}

// With n a bucket size there is no padding: the arrays are the eager plan's
// element for element, and a second step reuses the same layout.
TEST_F(DecodeGraphPackTest, FullBucketEqualsTheEagerPlan) {
  std::vector<ForwardItem> items = Items({5, 40, 1, 12});
  const DecodeGraphLayout layout = MakeDecodeGraphLayout(4, 16);
  std::vector<int32_t> out(layout.total);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(ValidateForwardItems(items, Limits()).ok());
    ForwardPlan plan;
    BuildForwardPlan(items, kBlockSize, &plan);
    const DecodeGraphPacked packed =
        PackDecodeGraphStep(items, kBlockSize, layout, out);
    const int64_t before_blocks = layout.offsets.block_ids;
    EXPECT_EQ(before_blocks, plan.offsets.block_ids) << "step " << step;
    EXPECT_THAT(std::vector<int32_t>(out.begin(), out.begin() + packed.used),
                ElementsAreArray(plan.packed))
        << "step " << step;
    EXPECT_EQ(packed.max_context_len, plan.max_context_len);
    for (ForwardItem& item : items) {
      ASSERT_TRUE(cache_->Reserve(*item.table, item.start_pos + 2).ok());
      ASSERT_TRUE(cache_->SetNumTokens(*item.table, item.start_pos + 1).ok());
      item.start_pos += 1;
    }
  }
}

}  // namespace
}  // namespace baton
