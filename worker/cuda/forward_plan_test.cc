// The host half of the CUDA step: validation as ModelRunner::Forward plus the
// device runner's limits, and the packed metadata layout. Runs everywhere
// (no device needed).
#include "worker/cuda/forward_plan.h"

#include <deque>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kBlockSize = 4;

class ForwardPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvCacheOptions options;
    options.num_layers = 2;
    options.num_kv_heads = 1;
    options.head_dim = 8;
    options.block_size = kBlockSize;
    options.num_blocks = 16;
    auto cache = KvCache::Create(options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    limits_.vocab_size = 100;
    limits_.context_length = 64;
    limits_.block_size = kBlockSize;
    limits_.num_blocks = 16;
    limits_.max_batch_tokens = 32;
  }
  void TearDown() override {
    for (BlockTable& t : tables_) cache_->Free(t);
  }

  // A table reserved for `capacity` tokens of which `cached` are committed.
  BlockTable* Table(int64_t capacity, int64_t cached) {
    tables_.emplace_back();
    BlockTable& t = tables_.back();
    EXPECT_TRUE(cache_->Reserve(t, capacity).ok());
    EXPECT_TRUE(cache_->SetNumTokens(t, cached).ok());
    return &t;
  }

  std::unique_ptr<KvCache> cache_;
  std::deque<BlockTable> tables_;
  ForwardLimits limits_;
};

TEST_F(ForwardPlanTest, PacksAMixedBatch) {
  BlockTable* filler = Table(8, 0);  // blocks 0, 1: later ids differ
  (void)filler;
  BlockTable* a = Table(6, 0);   // blocks 2, 3
  BlockTable* b = Table(10, 9);  // blocks 4, 5, 6
  BlockTable* c = Table(4, 2);   // block 7
  const std::vector<int32_t> ta = {11, 12, 13, 14, 15};
  const std::vector<int32_t> tb = {21};
  const std::vector<int32_t> tc = {31, 32};
  const std::vector<ForwardItem> items = {
      {a, 0, ta, LogitsMode::kAll},
      {b, 9, tb, LogitsMode::kLast},
      {c, 2, tc, LogitsMode::kNone},
  };
  ASSERT_TRUE(ValidateForwardItems(items, limits_).ok());
  ForwardPlan plan;
  BuildForwardPlan(items, kBlockSize, &plan);
  EXPECT_EQ(plan.num_tokens, 8);
  EXPECT_EQ(plan.num_seqs, 3);
  EXPECT_FALSE(plan.all_single_token);
  EXPECT_EQ(plan.max_queries_per_seq, 5);
  EXPECT_EQ(plan.max_context_len, 10);
  EXPECT_EQ(plan.num_logit_rows, 6);
  const ForwardPlanOffsets& o = plan.offsets;
  auto slice = [&](int64_t offset, int64_t n) {
    return std::vector<int32_t>(plan.packed.begin() + offset,
                                plan.packed.begin() + offset + n);
  };
  EXPECT_THAT(slice(o.token_ids, 8),
              ElementsAre(11, 12, 13, 14, 15, 21, 31, 32));
  EXPECT_THAT(slice(o.positions, 8), ElementsAre(0, 1, 2, 3, 4, 9, 2, 3));
  EXPECT_THAT(slice(o.token_blocks, 8), ElementsAre(2, 2, 2, 2, 3, 6, 7, 7));
  EXPECT_THAT(slice(o.cu_seqlens, 4), ElementsAre(0, 5, 6, 8));
  EXPECT_THAT(slice(o.start_pos, 3), ElementsAre(0, 9, 2));
  EXPECT_THAT(slice(o.context_lens, 3), ElementsAre(5, 10, 4));
  // Only the blocks covering [0, start_pos + tokens) of each item.
  EXPECT_THAT(slice(o.row_offsets, 4), ElementsAre(0, 2, 5, 6));
  EXPECT_THAT(slice(o.logit_rows, 6), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(slice(o.block_ids, 6), ElementsAre(2, 3, 4, 5, 6, 7));
  EXPECT_EQ(static_cast<int64_t>(plan.packed.size()), o.block_ids + 6);
}

TEST_F(ForwardPlanTest, SingleTokenItemsUseTheDecodePath) {
  BlockTable* a = Table(8, 7);
  BlockTable* b = Table(3, 2);
  const std::vector<int32_t> ta = {5}, tb = {6};
  const std::vector<ForwardItem> items = {{a, 7, ta, LogitsMode::kLast},
                                          {b, 2, tb, LogitsMode::kLast}};
  ASSERT_TRUE(ValidateForwardItems(items, limits_).ok());
  ForwardPlan plan;
  BuildForwardPlan(items, kBlockSize, &plan);
  EXPECT_TRUE(plan.all_single_token);
  EXPECT_EQ(plan.max_context_len, 8);
  EXPECT_EQ(plan.max_queries_per_seq, 1);
  EXPECT_EQ(plan.num_logit_rows, 2);
  EXPECT_EQ(plan.packed[plan.offsets.logit_rows + 1], 1);
}

TEST_F(ForwardPlanTest, RejectsWhatTheCpuRunnerRejects) {
  BlockTable* t = Table(8, 2);
  const std::vector<int32_t> ok = {1, 2};
  const std::vector<int32_t> bad_token = {1, 100};
  const std::vector<int32_t> negative = {-1};
  const std::vector<int32_t> none;
  const std::vector<int32_t> long_run(7, 3);
  struct Case {
    ForwardItem item;
    const char* message;
  };
  const Case cases[] = {
      {{nullptr, 0, ok, LogitsMode::kLast}, "has no table or no tokens"},
      {{t, 2, none, LogitsMode::kLast}, "has no table or no tokens"},
      {{t, 2, bad_token, LogitsMode::kLast},
       "token id 100 is outside [0, 100)"},
      {{t, 2, negative, LogitsMode::kLast}, "token id -1"},
      {{t, 0, ok, LogitsMode::kLast}, "but its cache holds 2 tokens"},
      {{t, 2, long_run, LogitsMode::kLast}, "needs 9 cached tokens"},
  };
  for (const Case& c : cases) {
    const std::vector<ForwardItem> items = {{t, 2, ok, LogitsMode::kLast},
                                            c.item};
    const absl::Status status = ValidateForwardItems(items, limits_);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr("batch item 1")) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << status;
  }
  limits_.context_length = 3;
  const std::vector<ForwardItem> beyond = {{t, 2, ok, LogitsMode::kLast}};
  EXPECT_THAT(ValidateForwardItems(beyond, limits_).message(),
              HasSubstr("beyond the context length 3"));
}

TEST_F(ForwardPlanTest, RejectsTheDeviceRunnersLimits) {
  BlockTable* filler = Table(40, 0);  // blocks 0..9
  (void)filler;
  BlockTable* t = Table(8, 0);  // blocks 10, 11
  const std::vector<int32_t> tokens(8, 1);
  const std::vector<ForwardItem> items = {{t, 0, tokens, LogitsMode::kLast}};
  limits_.max_batch_tokens = 7;
  EXPECT_THAT(ValidateForwardItems(items, limits_).message(),
              HasSubstr("more than 7 tokens (max_batch_tokens)"));
  limits_.max_batch_tokens = 8;
  EXPECT_TRUE(ValidateForwardItems(items, limits_).ok());
  // A device pool smaller than the allocator's.
  limits_.num_blocks = 11;
  const absl::Status status = ValidateForwardItems(items, limits_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("has id 11, outside the device pool"));
  limits_.num_blocks = 0;
  EXPECT_THAT(ValidateForwardItems(items, limits_).message(),
              HasSubstr("forward limits out of range"));
}

TEST_F(ForwardPlanTest, EmptyBatchIsValidAndEmpty) {
  ASSERT_TRUE(ValidateForwardItems({}, limits_).ok());
  ForwardPlan plan;
  BuildForwardPlan({}, kBlockSize, &plan);
  EXPECT_EQ(plan.num_tokens, 0);
  EXPECT_FALSE(plan.all_single_token);
  EXPECT_THAT(plan.packed, ElementsAre(0, 0));  // cu_seqlens, row_offsets
}

}  // namespace
}  // namespace baton
