// PagedAttentionDecode against kernels/cpu/paged_attention.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_test_util.h"

namespace baton::cuda_test {
namespace {

constexpr int64_t kLayers = 2;
constexpr int64_t kLayer = 1;  // not 0, so the layer offset is exercised

// Runs PagedAttentionDecode for sequences of `contexts` keys, blocks
// `tables`, queries q [num_seqs][num_heads][head_dim], with max_context_len
// the largest context; *out gets the result (poisoned before the run).
void RunDecode(const HostKvPool& pool, const DeviceBuffer<uint16_t>& dev_pool,
               const AttentionConfig& c, std::span<const int64_t> contexts,
               const HostBlockTables& tables, const std::vector<float>& q,
               std::vector<float>* out) {
  const int32_t num_seqs = static_cast<int32_t>(contexts.size());
  std::vector<int32_t> ctx32(contexts.begin(), contexts.end());
  int32_t max_ctx = 1;
  for (int32_t x : ctx32) max_ctx = std::max(max_ctx, x);
  DeviceBuffer<float> dev_q{std::span<const float>(q)};
  DeviceBuffer<int32_t> dev_ctx{std::span<const int32_t>(ctx32)};
  DeviceBuffer<int32_t> dev_ids{std::span<const int32_t>(tables.ids)};
  DeviceBuffer<int32_t> dev_offsets{std::span<const int32_t>(tables.offsets)};
  const size_t ws_bytes = cuda::PagedDecodeWorkspaceBytes(num_seqs, c.num_heads,
                                                          c.head_dim, max_ctx);
  DeviceBuffer<float> workspace(ws_bytes / sizeof(float));
  DeviceBuffer<float> dev_out(q.size());
  dev_out.Poison();
  workspace.Poison();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  cuda::PagedDecodeBatch batch;
  batch.num_seqs = num_seqs;
  batch.max_context_len = max_ctx;
  batch.context_lens = dev_ctx.get();
  batch.tables = {dev_ids.get(), dev_offsets.get()};
  BATON_ASSERT_CUDA_OK(cuda::PagedAttentionDecode(
      dev_q.get(), batch, pool.DeviceView(dev_pool.get(), kLayer), c.num_heads,
      c.scale(), ws_bytes == 0 ? nullptr : workspace.get(), ws_bytes,
      dev_out.get(), nullptr));
  *out = dev_out.Download();
}

// The CPU kernel's answer for the same batch.
std::vector<float> ReferenceDecode(const HostKvPool& pool,
                                   const AttentionConfig& c,
                                   std::span<const int64_t> contexts,
                                   const HostBlockTables& tables,
                                   const std::vector<float>& q) {
  const int64_t row = c.num_heads * c.head_dim;
  std::vector<float> ref(q.size());
  for (size_t s = 0; s < contexts.size(); ++s) {
    pool.Reference(kLayer, tables.Row(s), q.data() + s * row, 1,
                   contexts[s] - 1, ref.data() + s * row);
  }
  return ref;
}

// Uploads a pool for `contexts`, runs both kernels, compares and prints.
void CheckDecode(const AttentionConfig& c, std::span<const int64_t> contexts,
                 uint32_t seed, const std::string& what) {
  const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
  HostKvPool pool(kLayers, blocks, c, seed);
  const HostBlockTables tables =
      ShuffledTables(contexts, c.block_size, blocks, seed + 1);
  const std::vector<float> q =
      RandomNormal(contexts.size() * c.num_heads * c.head_dim, seed + 2);
  DeviceBuffer<uint16_t> dev_pool(pool.data());
  std::vector<float> got;
  RunDecode(pool, dev_pool, c, contexts, tables, q, &got);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<float> ref = ReferenceDecode(pool, c, contexts, tables, q);
  const MaxError err = ExpectAllClose(got, ref, kAtol, kRtol, what);
  PrintKernelError("paged_attention_decode", what, err.abs);
}

class CudaPagedAttentionDecodeTest
    : public ::testing::TestWithParam<AttentionConfig> {};

// Short (unsplit) and long (split: 989 -> 16, 2049 -> 33 splits, 4500 ->
// the cap of 64) contexts in one launch, around the split threshold too (64
// unsplit, 65 split).
TEST_P(CudaPagedAttentionDecodeTest, MatchesCpuOverMixedContexts) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c = GetParam();
  const std::vector<int64_t> contexts = {1, 7, 19, 989, 2049, 64, 65, 4500};
  ASSERT_EQ(cuda::PagedDecodeNumSplits(64), 1);
  ASSERT_EQ(cuda::PagedDecodeNumSplits(65), 2);
  ASSERT_EQ(cuda::PagedDecodeNumSplits(2049), 33);
  ASSERT_EQ(cuda::PagedDecodeNumSplits(4500), 64);
  CheckDecode(c, contexts, 100, c.Name() + "_mixed");
}

// A batch of short contexts runs the single-kernel path with no workspace.
TEST_P(CudaPagedAttentionDecodeTest, ShortContextsNeedNoWorkspace) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c = GetParam();
  const std::vector<int64_t> contexts = {1, 7, 19, 50, 64};
  ASSERT_EQ(cuda::PagedDecodeWorkspaceBytes(5, c.num_heads, c.head_dim, 64),
            0u);
  CheckDecode(c, contexts, 200, c.Name() + "_unsplit");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaPagedAttentionDecodeTest, ::testing::ValuesIn(AllConfigs()),
    [](const ::testing::TestParamInfo<AttentionConfig>& info) {
      return info.param.Name();
    });

// A sequence's output does not depend on its batch (nor on the batch's
// max_context_len, which sets the workspace layout): bit-identical.
TEST(CudaPagedAttentionDecode, BatchDoesNotChangeBits) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c{64, 16, 9, 3};
  const std::vector<int64_t> contexts = {2049, 19, 989};
  const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
  HostKvPool pool(kLayers, blocks, c, 300);
  const HostBlockTables tables =
      ShuffledTables(contexts, c.block_size, blocks, 301);
  const std::vector<float> q =
      RandomNormal(contexts.size() * c.num_heads * c.head_dim, 302);
  DeviceBuffer<uint16_t> dev_pool(pool.data());
  std::vector<float> batched;
  RunDecode(pool, dev_pool, c, contexts, tables, q, &batched);
  if (HasFatalFailure()) return;
  const int64_t row = c.num_heads * c.head_dim;
  for (size_t s : {size_t{1}, size_t{2}}) {
    HostBlockTables alone;
    const std::span<const int32_t> ids = tables.Row(s);
    alone.ids.assign(ids.begin(), ids.end());
    alone.offsets.push_back(static_cast<int32_t>(ids.size()));
    const std::vector<float> q_alone(q.begin() + s * row,
                                     q.begin() + (s + 1) * row);
    std::vector<float> single;
    RunDecode(pool, dev_pool, c, std::span<const int64_t>(&contexts[s], 1),
              alone, q_alone, &single);
    if (HasFatalFailure()) return;
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(single[i], batched[s * row + i])
          << "sequence " << s << " element " << i;
    }
  }
}

// A block id outside the pool turns its sequence's rows into NaN, on the
// unsplit (sequence 0) and the split (sequence 1) path, and leaves the other
// sequences exact.
TEST(CudaPagedAttentionDecode, BadBlockIdGivesNaNForItsSequenceOnly) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c{128, 16, 8, 2};
  const std::vector<int64_t> contexts = {19, 600, 40};
  const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
  HostKvPool pool(kLayers, blocks, c, 400);
  HostBlockTables tables = ShuffledTables(contexts, c.block_size, blocks, 401);
  const std::vector<float> q =
      RandomNormal(contexts.size() * c.num_heads * c.head_dim, 402);
  const std::vector<float> ref = ReferenceDecode(pool, c, contexts, tables, q);
  tables.ids[tables.offsets[0]] = -1;
  tables.ids[tables.offsets[1] + 20] = static_cast<int32_t>(blocks);
  DeviceBuffer<uint16_t> dev_pool(pool.data());
  std::vector<float> got;
  RunDecode(pool, dev_pool, c, contexts, tables, q, &got);
  if (HasFatalFailure()) return;
  const size_t row = c.num_heads * c.head_dim;
  for (size_t i = 0; i < 2 * row; ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "element " << i << " is " << got[i];
  }
  const MaxError err = ExpectAllClose(
      std::span<const float>(got).subspan(2 * row),
      std::span<const float>(ref).subspan(2 * row), kAtol, kRtol, "seq 2");
  PrintKernelError("paged_attention_decode", c.Name() + "_bad_block", err.abs);
}

}  // namespace
}  // namespace baton::cuda_test
