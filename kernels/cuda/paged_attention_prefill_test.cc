// PagedAttentionPrefill against kernels/cpu/paged_attention.h.
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

constexpr int64_t kLayers = 3;
constexpr int64_t kLayer = 2;  // not 0, so the layer offset is exercised

// One sequence of a prefill batch: new tokens at positions
// [start_pos, start_pos + num_queries).
struct Chunk {
  int64_t start_pos = 0;
  int64_t num_queries = 0;
  int64_t context() const { return start_pos + num_queries; }
};

// Rows of q and out: the chunks' tokens in order, then `padding` rows that
// belong to no sequence.
struct PrefillInputs {
  std::vector<Chunk> chunks;
  std::vector<int32_t> cu_seqlens{0};
  int64_t num_tokens = 0;
};

PrefillInputs MakeInputs(std::vector<Chunk> chunks, int64_t padding) {
  PrefillInputs in;
  in.chunks = std::move(chunks);
  for (const Chunk& ch : in.chunks) {
    in.cu_seqlens.push_back(
        static_cast<int32_t>(in.cu_seqlens.back() + ch.num_queries));
  }
  in.num_tokens = in.cu_seqlens.back() + padding;
  return in;
}

std::vector<int64_t> Contexts(const PrefillInputs& in) {
  std::vector<int64_t> ctx;
  for (const Chunk& ch : in.chunks) ctx.push_back(ch.context());
  return ctx;
}

// Runs PagedAttentionPrefill; *out gets all num_tokens rows (poisoned
// before the run).
void RunPrefill(const HostKvPool& pool, const DeviceBuffer<uint16_t>& dev_pool,
                const AttentionConfig& c, const PrefillInputs& in,
                const HostBlockTables& tables, const std::vector<float>& q,
                std::vector<float>* out) {
  std::vector<int32_t> start;
  int32_t max_q = 0;
  for (const Chunk& ch : in.chunks) {
    start.push_back(static_cast<int32_t>(ch.start_pos));
    max_q = std::max(max_q, static_cast<int32_t>(ch.num_queries));
  }
  DeviceBuffer<float> dev_q{std::span<const float>(q)};
  DeviceBuffer<int32_t> dev_cu{std::span<const int32_t>(in.cu_seqlens)};
  DeviceBuffer<int32_t> dev_start{std::span<const int32_t>(start)};
  DeviceBuffer<int32_t> dev_ids{std::span<const int32_t>(tables.ids)};
  DeviceBuffer<int32_t> dev_offsets{std::span<const int32_t>(tables.offsets)};
  DeviceBuffer<float> dev_out(q.size());
  dev_out.Poison();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  cuda::PagedPrefillBatch batch;
  batch.num_seqs = static_cast<int32_t>(in.chunks.size());
  batch.num_tokens = static_cast<int32_t>(in.num_tokens);
  batch.max_queries_per_seq = max_q;
  batch.cu_seqlens_q = dev_cu.get();
  batch.start_pos = dev_start.get();
  batch.tables = {dev_ids.get(), dev_offsets.get()};
  BATON_ASSERT_CUDA_OK(cuda::PagedAttentionPrefill(
      dev_q.get(), batch, pool.DeviceView(dev_pool.get(), kLayer), c.num_heads,
      c.scale(), dev_out.get(), nullptr));
  *out = dev_out.Download();
}

// The CPU kernel's rows for every sequence (padding rows stay 0).
std::vector<float> ReferencePrefill(const HostKvPool& pool,
                                    const AttentionConfig& c,
                                    const PrefillInputs& in,
                                    const HostBlockTables& tables,
                                    const std::vector<float>& q) {
  const int64_t row = c.num_heads * c.head_dim;
  std::vector<float> ref(q.size(), 0.0f);
  for (size_t s = 0; s < in.chunks.size(); ++s) {
    const int64_t first = in.cu_seqlens[s] * row;
    pool.Reference(kLayer, tables.Row(s), q.data() + first,
                   in.chunks[s].num_queries, in.chunks[s].start_pos,
                   ref.data() + first);
  }
  return ref;
}

class CudaPagedAttentionPrefillTest
    : public ::testing::TestWithParam<AttentionConfig> {};

// Contexts 1, 7, 19, 989, 2049 in one launch: whole prompts and chunks that
// start mid-sequence (start_pos 11 and 1060), over shuffled block tables;
// rows that belong to no sequence stay untouched.
TEST_P(CudaPagedAttentionPrefillTest, MatchesCpuOverChunkedBatch) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c = GetParam();
  const int64_t kPadding = 3;
  const PrefillInputs in =
      MakeInputs({{0, 1}, {0, 7}, {11, 8}, {0, 989}, {1060, 989}}, kPadding);
  const std::vector<int64_t> contexts = Contexts(in);
  const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
  HostKvPool pool(kLayers, blocks, c, 500);
  const HostBlockTables tables =
      ShuffledTables(contexts, c.block_size, blocks, 501);
  const int64_t row = c.num_heads * c.head_dim;
  const std::vector<float> q = RandomNormal(in.num_tokens * row, 502);
  DeviceBuffer<uint16_t> dev_pool(pool.data());
  std::vector<float> got;
  RunPrefill(pool, dev_pool, c, in, tables, q, &got);
  if (HasFatalFailure()) return;
  const std::vector<float> ref = ReferencePrefill(pool, c, in, tables, q);
  const size_t used = in.cu_seqlens.back() * row;
  const MaxError err = ExpectAllClose(std::span<const float>(got).first(used),
                                      std::span<const float>(ref).first(used),
                                      kAtol, kRtol, c.Name());
  EXPECT_TRUE(AllPoison(std::span<const float>(got).subspan(used)))
      << "rows outside every sequence were written";
  PrintKernelError("paged_attention_prefill", c.Name() + "_batch", err.abs);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaPagedAttentionPrefillTest, ::testing::ValuesIn(AllConfigs()),
    [](const ::testing::TestParamInfo<AttentionConfig>& info) {
      return info.param.Name();
    });

// A prompt prefilled in one chunk or in two chunks (both in one batch, over
// the same blocks) gives bit-identical rows.
TEST(CudaPagedAttentionPrefill, ChunkingDoesNotChangeBits) {
  BATON_SKIP_WITHOUT_CUDA();
  for (const AttentionConfig& c :
       {AttentionConfig{64, 16, 9, 3}, AttentionConfig{128, 32, 8, 2}}) {
    const PrefillInputs whole = MakeInputs({{0, 300}}, 0);
    const PrefillInputs split = MakeInputs({{0, 113}, {113, 187}}, 0);
    const std::vector<int64_t> contexts = {300};
    const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
    HostKvPool pool(kLayers, blocks, c, 600);
    const HostBlockTables one =
        ShuffledTables(contexts, c.block_size, blocks, 601);
    HostBlockTables two = one;
    two.ids.insert(two.ids.end(), one.ids.begin(), one.ids.end());
    two.offsets.push_back(static_cast<int32_t>(two.ids.size()));
    const std::vector<float> q =
        RandomNormal(300 * c.num_heads * c.head_dim, 602);
    DeviceBuffer<uint16_t> dev_pool(pool.data());
    std::vector<float> a;
    std::vector<float> b;
    RunPrefill(pool, dev_pool, c, whole, one, q, &a);
    if (HasFatalFailure()) return;
    RunPrefill(pool, dev_pool, c, split, two, q, &b);
    if (HasFatalFailure()) return;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i], b[i]) << c.Name() << " element " << i;
    }
  }
}

// A block id outside the pool turns its sequence's rows into NaN and leaves
// the other sequence exact.
TEST(CudaPagedAttentionPrefill, BadBlockIdGivesNaNForItsSequenceOnly) {
  BATON_SKIP_WITHOUT_CUDA();
  const AttentionConfig c{64, 16, 4, 4};
  const PrefillInputs in = MakeInputs({{0, 19}, {5, 30}}, 0);
  const std::vector<int64_t> contexts = Contexts(in);
  const int64_t blocks = PoolBlocksFor(contexts, c.block_size);
  HostKvPool pool(kLayers, blocks, c, 700);
  HostBlockTables tables = ShuffledTables(contexts, c.block_size, blocks, 701);
  const int64_t row = c.num_heads * c.head_dim;
  const std::vector<float> q = RandomNormal(in.num_tokens * row, 702);
  const std::vector<float> ref = ReferencePrefill(pool, c, in, tables, q);
  tables.ids[tables.offsets[0] + 1] = static_cast<int32_t>(blocks);
  DeviceBuffer<uint16_t> dev_pool(pool.data());
  std::vector<float> got;
  RunPrefill(pool, dev_pool, c, in, tables, q, &got);
  if (HasFatalFailure()) return;
  const size_t first = in.cu_seqlens[1] * row;
  for (size_t i = 0; i < first; ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "element " << i << " is " << got[i];
  }
  const MaxError err = ExpectAllClose(
      std::span<const float>(got).subspan(first),
      std::span<const float>(ref).subspan(first), kAtol, kRtol, "seq 1");
  PrintKernelError("paged_attention_prefill", c.Name() + "_bad_block", err.abs);
}

}  // namespace
}  // namespace baton::cuda_test
