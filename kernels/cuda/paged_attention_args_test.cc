// Host-side contract of the paged attention entry points: argument checks
// (which return before any CUDA call, so they run without a device), the
// split count and the workspace size.
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/cuda/paged_attention.h"

namespace baton::cuda {
namespace {

// Stand-ins for device pointers: the checks look at them, never through them.
alignas(16) float g_floats[64];
alignas(16) uint16_t g_pool[64];
alignas(16) int32_t g_ints[64];

PagedKvPoolView GoodPool() {
  return PagedKvPoolView{g_pool, 1, 100, 3, 64, 16};
}

PagedDecodeBatch GoodDecodeBatch(int32_t max_context_len) {
  PagedDecodeBatch batch;
  batch.num_seqs = 2;
  batch.max_context_len = max_context_len;
  batch.context_lens = g_ints;
  batch.tables = {g_ints, g_ints};
  return batch;
}

PagedPrefillBatch GoodPrefillBatch() {
  PagedPrefillBatch batch;
  batch.num_seqs = 2;
  batch.num_tokens = 10;
  batch.max_queries_per_seq = 7;
  batch.cu_seqlens_q = g_ints;
  batch.start_pos = g_ints;
  batch.tables = {g_ints, g_ints};
  return batch;
}

cudaError_t Decode(const PagedDecodeBatch& batch, const PagedKvPoolView& kv,
                   int64_t num_heads, void* ws, size_t ws_bytes,
                   const float* q = g_floats, float* out = g_floats) {
  return PagedAttentionDecode(q, batch, kv, num_heads, 0.125f, ws, ws_bytes,
                              out, nullptr);
}

cudaError_t Prefill(const PagedPrefillBatch& batch, const PagedKvPoolView& kv,
                    int64_t num_heads, const float* q = g_floats,
                    float* out = g_floats) {
  return PagedAttentionPrefill(q, batch, kv, num_heads, 0.125f, out, nullptr);
}

TEST(CudaPagedAttentionArgsTest, SplitCountFollowsContextLength) {
  EXPECT_EQ(PagedDecodeNumSplits(1), 1);
  EXPECT_EQ(PagedDecodeNumSplits(64), 1);
  EXPECT_EQ(PagedDecodeNumSplits(65), 2);
  EXPECT_EQ(PagedDecodeNumSplits(989), 16);
  EXPECT_EQ(PagedDecodeNumSplits(2049), 33);
  EXPECT_EQ(PagedDecodeNumSplits(int64_t{1} << 20), kPagedDecodeMaxSplits);
}

TEST(CudaPagedAttentionArgsTest, WorkspaceCoversEverySplit) {
  EXPECT_EQ(PagedDecodeWorkspaceBytes(5, 9, 64, 64), 0u);
  EXPECT_EQ(PagedDecodeWorkspaceBytes(5, 9, 64, 2049),
            size_t{5} * 9 * 33 * (64 + 2) * sizeof(float));
  EXPECT_EQ(PagedDecodeWorkspaceBytes(3, 32, 128, 1 << 20),
            size_t{3} * 32 * kPagedDecodeMaxSplits * (128 + 2) * sizeof(float));
}

TEST(CudaPagedAttentionArgsTest, EmptyBatchesSucceedWithoutLaunching) {
  PagedDecodeBatch decode;
  EXPECT_EQ(Decode(decode, GoodPool(), 9, nullptr, 0, nullptr, nullptr),
            cudaSuccess);
  PagedPrefillBatch prefill;
  EXPECT_EQ(Prefill(prefill, GoodPool(), 9, nullptr, nullptr), cudaSuccess);
}

TEST(CudaPagedAttentionArgsTest, RejectsUnsupportedHeadDims) {
  for (int64_t head_dim : {0, 32, 96, 256}) {
    PagedKvPoolView kv = GoodPool();
    kv.head_dim = head_dim;
    EXPECT_EQ(Decode(GoodDecodeBatch(19), kv, 9, nullptr, 0),
              cudaErrorInvalidValue)
        << head_dim;
    EXPECT_EQ(Prefill(GoodPrefillBatch(), kv, 9), cudaErrorInvalidValue)
        << head_dim;
  }
}

TEST(CudaPagedAttentionArgsTest, RejectsBadHeadCounts) {
  // 10 is no multiple of 3; 51 / 3 = 17 exceeds the largest group; 0.
  for (int64_t num_heads : {10, 51, 0, -3}) {
    EXPECT_EQ(Decode(GoodDecodeBatch(19), GoodPool(), num_heads, nullptr, 0),
              cudaErrorInvalidValue)
        << num_heads;
    EXPECT_EQ(Prefill(GoodPrefillBatch(), GoodPool(), num_heads),
              cudaErrorInvalidValue)
        << num_heads;
  }
}

TEST(CudaPagedAttentionArgsTest, RejectsBadPoolGeometry) {
  const auto bad = [](auto mutate) {
    PagedKvPoolView kv = GoodPool();
    mutate(kv);
    return kv;
  };
  const PagedKvPoolView pools[] = {
      bad([](PagedKvPoolView& kv) { kv.pool = nullptr; }),
      bad([](PagedKvPoolView& kv) { kv.pool = g_pool + 1; }),  // misaligned
      bad([](PagedKvPoolView& kv) { kv.layer = -1; }),
      bad([](PagedKvPoolView& kv) { kv.num_blocks = 0; }),
      bad([](PagedKvPoolView& kv) { kv.num_kv_heads = 0; }),
      bad([](PagedKvPoolView& kv) { kv.block_size = 0; }),
      bad([](PagedKvPoolView& kv) { kv.block_size = 2048; }),
  };
  for (const PagedKvPoolView& kv : pools) {
    EXPECT_EQ(Decode(GoodDecodeBatch(19), kv, 9, nullptr, 0),
              cudaErrorInvalidValue);
    EXPECT_EQ(Prefill(GoodPrefillBatch(), kv, 9), cudaErrorInvalidValue);
  }
}

TEST(CudaPagedAttentionArgsTest, RejectsNullOrMisalignedPointers) {
  EXPECT_EQ(Decode(GoodDecodeBatch(19), GoodPool(), 9, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(Decode(GoodDecodeBatch(19), GoodPool(), 9, nullptr, 0, g_floats,
                   g_floats + 1),
            cudaErrorInvalidValue);
  PagedDecodeBatch no_ctx = GoodDecodeBatch(19);
  no_ctx.context_lens = nullptr;
  EXPECT_EQ(Decode(no_ctx, GoodPool(), 9, nullptr, 0), cudaErrorInvalidValue);

  EXPECT_EQ(Prefill(GoodPrefillBatch(), GoodPool(), 9, g_floats + 2),
            cudaErrorInvalidValue);
  PagedPrefillBatch no_start = GoodPrefillBatch();
  no_start.start_pos = nullptr;
  EXPECT_EQ(Prefill(no_start, GoodPool(), 9), cudaErrorInvalidValue);
  PagedPrefillBatch no_table = GoodPrefillBatch();
  no_table.tables.block_ids = nullptr;
  EXPECT_EQ(Prefill(no_table, GoodPool(), 9), cudaErrorInvalidValue);
}

TEST(CudaPagedAttentionArgsTest, RejectsBadCounts) {
  PagedDecodeBatch decode = GoodDecodeBatch(19);
  decode.num_seqs = -1;
  EXPECT_EQ(Decode(decode, GoodPool(), 9, nullptr, 0), cudaErrorInvalidValue);
  decode.num_seqs = 70000;
  EXPECT_EQ(Decode(decode, GoodPool(), 9, nullptr, 0), cudaErrorInvalidValue);
  decode = GoodDecodeBatch(0);
  EXPECT_EQ(Decode(decode, GoodPool(), 9, nullptr, 0), cudaErrorInvalidValue);

  PagedPrefillBatch prefill = GoodPrefillBatch();
  prefill.num_tokens = -1;
  EXPECT_EQ(Prefill(prefill, GoodPool(), 9), cudaErrorInvalidValue);
  prefill = GoodPrefillBatch();
  prefill.max_queries_per_seq = -1;
  EXPECT_EQ(Prefill(prefill, GoodPool(), 9), cudaErrorInvalidValue);
}

// A split context needs the workspace PagedDecodeWorkspaceBytes names.
TEST(CudaPagedAttentionArgsTest, RejectsMissingOrShortWorkspace) {
  const PagedDecodeBatch batch = GoodDecodeBatch(2049);
  const size_t needed = PagedDecodeWorkspaceBytes(2, 9, 64, 2049);
  ASSERT_GT(needed, 0u);
  EXPECT_EQ(Decode(batch, GoodPool(), 9, nullptr, needed),
            cudaErrorInvalidValue);
  EXPECT_EQ(Decode(batch, GoodPool(), 9, g_floats, needed - 4),
            cudaErrorInvalidValue);
  EXPECT_EQ(Decode(batch, GoodPool(), 9, g_floats + 1, needed),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace baton::cuda
