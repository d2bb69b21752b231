// The runner's own device ops against their CPU counterparts: WriteKvF16 vs
// KvCache::WriteKv (whole pool compared bit for bit), F32ToBF16 vs
// baton::F32ToBF16, AddBias vs a float add, GatherRows vs a copy. All are
// exact (tolerance 0): each output is one IEEE rounding of one input.
#include "worker/cuda/runner_kernels.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/cuda_test_util.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton::cuda {
namespace {

using cuda_test::DeviceBuffer;

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// Argument checks return before any CUDA call, so they run everywhere.
TEST(RunnerKernelsArgsTest, RejectsBadArgumentsWithoutLaunching) {
  KvPoolShape shape{2, 4, 1, 64, 16};
  float f = 0;
  int32_t i = 0;
  uint16_t u = 0;
  EXPECT_EQ(WriteKvF16(&f, &f, &i, &i, -1, shape, 0, &u, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(WriteKvF16(&f, &f, &i, &i, 1, shape, 2, &u, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(WriteKvF16(&f, nullptr, &i, &i, 1, shape, 0, &u, nullptr),
            cudaErrorInvalidValue);
  KvPoolShape empty = shape;
  empty.block_size = 0;
  EXPECT_EQ(WriteKvF16(&f, &f, &i, &i, 1, empty, 0, &u, nullptr),
            cudaErrorInvalidValue);
  KvPoolShape huge = shape;
  huge.num_blocks = int64_t{1} << 62;
  EXPECT_EQ(WriteKvF16(&f, &f, &i, &i, 1, huge, 0, &u, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(WriteKvF16(nullptr, nullptr, nullptr, nullptr, 0, shape, 0, nullptr,
                       nullptr),
            cudaSuccess);
  EXPECT_EQ(F32ToBF16(&f, -1, &u, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(F32ToBF16(nullptr, 3, &u, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(F32ToBF16(nullptr, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(AddBias(&f, &f, -2, 3, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(AddBias(&f, nullptr, 2, 3, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(AddBias(&f, &f, int64_t{1} << 40, int64_t{1} << 40, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GatherRows(&f, 1, &i, -1, 4, &f, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(GatherRows(&f, -1, &i, 1, 4, &f, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(GatherRows(nullptr, 1, &i, 1, 4, &f, nullptr),
            cudaErrorInvalidValue);
}

struct KvCase {
  int64_t tokens, kv_heads, head_dim, block_size;
};

void PrintTo(const KvCase& c, std::ostream* os) {
  *os << "{tokens " << c.tokens << ", kv_heads " << c.kv_heads << ", head_dim "
      << c.head_dim << ", block_size " << c.block_size << "}";
}

class WriteKvTest : public ::testing::TestWithParam<KvCase> {};

TEST_P(WriteKvTest, MatchesKvCacheWriteKv) {
  BATON_SKIP_WITHOUT_CUDA();
  const KvCase c = GetParam();
  KvCacheOptions options;
  options.num_layers = 3;
  options.num_kv_heads = c.kv_heads;
  options.head_dim = c.head_dim;
  options.block_size = c.block_size;
  options.num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 3;
  auto cache = KvCache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  BlockTable filler, table;
  ASSERT_TRUE((*cache)->Reserve(filler, 2 * c.block_size).ok());
  ASSERT_TRUE((*cache)->Reserve(table, c.tokens).ok());
  const int64_t kv_dim = c.kv_heads * c.head_dim;
  const std::vector<float> k = RandomFloats(c.tokens * kv_dim, 1, 4.0f);
  const std::vector<float> v = RandomFloats(c.tokens * kv_dim, 2, 4.0f);
  std::vector<int32_t> positions(c.tokens), blocks(c.tokens);
  constexpr int64_t kLayer = 1;
  for (int64_t t = 0; t < c.tokens; ++t) {
    // Positions in reverse order: the kernel must not assume sorted rows.
    const int64_t pos = c.tokens - 1 - t;
    positions[t] = static_cast<int32_t>(pos);
    blocks[t] = table.block_ids()[pos / c.block_size];
    (*cache)->WriteKv(table, kLayer, pos, k.data() + t * kv_dim,
                      v.data() + t * kv_dim);
  }
  const uint8_t* host_pool = (*cache)->LayerBlock(0, 0);
  const size_t pool_elems = (*cache)->pool_bytes() / 2;
  DeviceBuffer<uint16_t> pool(pool_elems);
  BATON_ASSERT_CUDA_OK(cudaMemset(pool.get(), 0, pool.bytes()));
  DeviceBuffer<float> dk{std::span<const float>(k)};
  DeviceBuffer<float> dv{std::span<const float>(v)};
  DeviceBuffer<int32_t> dpos{std::span<const int32_t>(positions)};
  DeviceBuffer<int32_t> dblocks{std::span<const int32_t>(blocks)};
  const KvPoolShape shape{options.num_layers, options.num_blocks, c.kv_heads,
                          c.head_dim, c.block_size};
  BATON_ASSERT_CUDA_OK(WriteKvF16(dk.get(), dv.get(), dpos.get(), dblocks.get(),
                                  c.tokens, shape, kLayer, pool.get(),
                                  nullptr));
  const std::vector<uint16_t> got = pool.Download();
  size_t mismatches = 0;
  for (size_t i = 0; i < pool_elems; ++i) {
    uint16_t want;
    std::memcpy(&want, host_pool + 2 * i, 2);
    mismatches += got[i] != want;
  }
  EXPECT_EQ(mismatches, 0u);
  std::printf(
      "BATON_KERNEL_ERROR op=write_kv_f16 case=t%lld_h%lld_d%lld_b%lld "
      "max_abs=%zu atol=0 rtol=0\n",
      static_cast<long long>(c.tokens), static_cast<long long>(c.kv_heads),
      static_cast<long long>(c.head_dim), static_cast<long long>(c.block_size),
      mismatches);
  (*cache)->Free(filler);
  (*cache)->Free(table);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WriteKvTest,
                         ::testing::Values(KvCase{1, 1, 64, 16},
                                           KvCase{7, 3, 64, 5},
                                           KvCase{19, 2, 128, 7},
                                           KvCase{989, 8, 128, 16}),
                         [](const ::testing::TestParamInfo<KvCase>& info) {
                           const KvCase& c = info.param;
                           return "t" + std::to_string(c.tokens) + "_h" +
                                  std::to_string(c.kv_heads) + "_d" +
                                  std::to_string(c.head_dim) + "_b" +
                                  std::to_string(c.block_size);
                         });

// A token with an invalid block id writes nothing.
TEST(RunnerKernelsTest, WriteKvSkipsInvalidBlocks) {
  BATON_SKIP_WITHOUT_CUDA();
  const KvPoolShape shape{1, 2, 1, 64, 4};
  DeviceBuffer<uint16_t> pool(2 * 2 * 64 * 4);
  BATON_ASSERT_CUDA_OK(cudaMemset(pool.get(), 0, pool.bytes()));
  const std::vector<float> k(2 * 64, 1.0f), v(2 * 64, 2.0f);
  const std::vector<int32_t> positions = {0, 1}, blocks = {-1, 2};
  DeviceBuffer<float> dk{std::span<const float>(k)};
  DeviceBuffer<float> dv{std::span<const float>(v)};
  DeviceBuffer<int32_t> dpos{std::span<const int32_t>(positions)};
  DeviceBuffer<int32_t> dblocks{std::span<const int32_t>(blocks)};
  BATON_ASSERT_CUDA_OK(WriteKvF16(dk.get(), dv.get(), dpos.get(), dblocks.get(),
                                  2, shape, 0, pool.get(), nullptr));
  for (uint16_t x : pool.Download()) ASSERT_EQ(x, 0);
}

TEST(RunnerKernelsTest, F32ToBF16MatchesCpu) {
  BATON_SKIP_WITHOUT_CUDA();
  // Past 2^16 blocks of 256 threads: the grid-stride loop runs twice.
  for (int64_t n : {int64_t{1}, int64_t{19}, (int64_t{1} << 24) + 989}) {
    std::vector<float> x = RandomFloats(n, 3, 1e3f);
    if (n > 4) {
      x[0] = 0x1.01p0f;  // halfway between two bf16: rounds to even
      x[1] = -0.0f;
      x[2] = INFINITY;
      x[3] = 3.4e38f;  // rounds to infinity
    }
    DeviceBuffer<float> dx{std::span<const float>(x)};
    DeviceBuffer<uint16_t> dy(n);
    dy.Poison();
    BATON_ASSERT_CUDA_OK(F32ToBF16(dx.get(), n, dy.get(), nullptr));
    const std::vector<uint16_t> got = dy.Download();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[i] != baton::F32ToBF16(x[i]);
    EXPECT_EQ(bad, 0) << "n = " << n;
    std::printf(
        "BATON_KERNEL_ERROR op=f32_to_bf16 case=n%lld max_abs=%lld atol=0 "
        "rtol=0\n",
        static_cast<long long>(n), static_cast<long long>(bad));
  }
}

TEST(RunnerKernelsTest, AddBiasAndGatherRowsMatchCpu) {
  BATON_SKIP_WITHOUT_CUDA();
  const int64_t rows = 7, cols = 989;
  const std::vector<float> x = RandomFloats(rows * cols, 4, 10.0f);
  const std::vector<float> bias = RandomFloats(cols, 5, 1.0f);
  DeviceBuffer<float> dx{std::span<const float>(x)};
  DeviceBuffer<float> dbias{std::span<const float>(bias)};
  BATON_ASSERT_CUDA_OK(AddBias(dx.get(), dbias.get(), rows, cols, nullptr));
  std::vector<float> want = x;
  for (int64_t i = 0; i < rows * cols; ++i) want[i] += bias[i % cols];
  const std::vector<float> got = dx.Download();
  const auto err = cuda_test::ExpectAllClose(got, want, 0, 0, "AddBias");
  std::printf(
      "BATON_KERNEL_ERROR op=add_bias case=7x989 max_abs=%g atol=0 rtol=0\n",
      err.abs);

  const std::vector<int32_t> idx = {6, 0, 3, 3, 7, -1};
  DeviceBuffer<int32_t> didx{std::span<const int32_t>(idx)};
  DeviceBuffer<float> out(idx.size() * cols);
  out.Poison();
  BATON_ASSERT_CUDA_OK(GatherRows(dx.get(), rows, didx.get(), idx.size(), cols,
                                  out.get(), nullptr));
  const std::vector<float> gathered = out.Download();
  for (size_t r = 0; r < idx.size(); ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float g = gathered[r * cols + c];
      if (idx[r] < 0 || idx[r] >= rows) {
        ASSERT_TRUE(std::isnan(g)) << "row " << r;
      } else {
        ASSERT_EQ(g, want[idx[r] * cols + c]) << "row " << r;
      }
    }
  }
  std::printf(
      "BATON_KERNEL_ERROR op=gather_rows case=6of7x989 max_abs=0 atol=0 "
      "rtol=0\n");
}

}  // namespace
}  // namespace baton::cuda
