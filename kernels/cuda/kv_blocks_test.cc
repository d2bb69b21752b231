// Device KV layer gather/scatter against KvCache::ExportLayer / ImportLayer,
// and CopyRuns against host copies.
#include "kernels/cuda/kv_blocks.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/kv_cache.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;

struct KvCase {
  const char* name;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  DType dtype;
  int64_t num_blocks;
  int staging_offset;  // bytes: 0 (16-byte copies), 8, or 1 (byte copies)
};

// Number of differing bytes, reporting the first.
int64_t CountDiffs(const uint8_t* got, const uint8_t* want, size_t n,
                   const std::string& what) {
  int64_t diffs = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i] && diffs++ == 0) {
      ADD_FAILURE() << what << ": byte " << i << " is " << int{got[i]}
                    << ", expected " << int{want[i]};
    }
  }
  return diffs;
}

void Report(const char* op, const std::string& what, int64_t diffs) {
  // Byte copies must be exact: max_abs counts differing bytes.
  std::printf("BATON_KERNEL_ERROR op=%s case=%s max_abs=%lld atol=0 rtol=0\n",
              op, what.c_str(), static_cast<long long>(diffs));
}

void RunCase(const KvCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  KvCacheOptions options;
  options.num_layers = 3;
  options.num_kv_heads = c.num_kv_heads;
  options.head_dim = c.head_dim;
  options.block_size = c.block_size;
  options.dtype = c.dtype;
  options.num_blocks = c.num_blocks;
  absl::StatusOr<std::unique_ptr<KvCache>> created = KvCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  KvCache& cache = **created;
  const int64_t bs = c.block_size;

  // Interleave two tables one block at a time, free the first, and let a
  // third take the rest: its block ids are neither contiguous nor sorted.
  BlockTable a, b, seq;
  for (int64_t i = 1; i <= c.num_blocks / 3; ++i) {
    ASSERT_TRUE(cache.Reserve(a, i * bs).ok());
    ASSERT_TRUE(cache.Reserve(b, i * bs).ok());
  }
  cache.Free(a);
  const int64_t capacity = cache.num_blocks_free() * bs;
  const int64_t num_tokens = capacity - (bs > 1 ? bs / 2 : 0);  // partial tail
  ASSERT_TRUE(cache.Reserve(seq, num_tokens).ok());
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> k(num_tokens * kv_dim), v(num_tokens * kv_dim);
  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    cache.WriteKvRange(seq, layer, 0, num_tokens, k.data(), v.data());
    cache.WriteKvRange(b, layer, 0, cache.Capacity(b) / 2, k.data(), v.data());
  }
  ASSERT_TRUE(cache.SetNumTokens(seq, num_tokens).ok());

  const uint8_t* host_pool = cache.LayerBlock(0, 0);
  const size_t pool_bytes = cache.pool_bytes();
  const KvPoolGeometry geometry{options.num_layers, cache.num_blocks_total(),
                                cache.chunk_bytes()};
  const int64_t num_chunks = cache.BlocksNeeded(num_tokens);
  const std::vector<int32_t> ids(seq.block_ids().begin(),
                                 seq.block_ids().begin() + num_chunks);
  ASSERT_FALSE(std::is_sorted(ids.begin(), ids.end())) << "weak test layout";
  const uint64_t layer_bytes = cache.LayerBytes(seq);
  ASSERT_EQ(layer_bytes, num_chunks * cache.chunk_bytes());

  DeviceBuffer<uint8_t> d_pool{std::span<const uint8_t>(host_pool, pool_bytes)};
  DeviceBuffer<int32_t> d_ids{std::span<const int32_t>(ids)};
  DeviceBuffer<uint8_t> d_staging(layer_bytes + 16);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  uint8_t* staging = d_staging.get() + c.staging_offset;

  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    const std::string what =
        std::string(c.name) + "_layer" + std::to_string(layer);
    // Gather == ExportLayer.
    std::vector<uint8_t> exported(layer_bytes);
    ASSERT_TRUE(cache.ExportLayer(seq, layer, exported).ok());
    d_staging.Poison();
    BATON_ASSERT_CUDA_OK(GatherKvLayer(d_pool.get(), geometry, layer,
                                       d_ids.get(), num_chunks, staging,
                                       nullptr));
    const std::vector<uint8_t> gathered = d_staging.Download();
    Report("kv_gather", what,
           CountDiffs(gathered.data() + c.staging_offset, exported.data(),
                      layer_bytes, what + " gather"));

    // Scatter == ImportLayer, and nothing else in the pool changes.
    std::vector<uint8_t> payload(layer_bytes + c.staging_offset);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& x : payload) x = static_cast<uint8_t>(byte(rng));
    const std::span<const uint8_t> incoming(payload.data() + c.staging_offset,
                                            layer_bytes);
    ASSERT_TRUE(cache.ImportLayer(seq, layer, num_tokens, incoming).ok());
    BATON_ASSERT_CUDA_OK(cudaMemcpy(d_staging.get(), payload.data(),
                                    payload.size(), cudaMemcpyHostToDevice));
    BATON_ASSERT_CUDA_OK(ScatterKvLayer(staging, geometry, layer, d_ids.get(),
                                        num_chunks, d_pool.get(), nullptr));
    const std::vector<uint8_t> pool_after = d_pool.Download();
    Report("kv_scatter", what,
           CountDiffs(pool_after.data(), cache.LayerBlock(0, 0), pool_bytes,
                      what + " scatter (whole pool)"));
  }
}

const KvCase kCases[] = {
    // name, kv_heads, head_dim, block_size, dtype, num_blocks, staging_offset
    {"smollm_f16", 3, 64, 16, DType::kF16, 37, 0},
    {"smollm_f16_off8", 3, 64, 16, DType::kF16, 37, 8},
    {"smollm_f16_off1", 3, 64, 16, DType::kF16, 37, 1},
    {"tiny_f16_chunk28", 1, 7, 1, DType::kF16, 19, 0},
    {"odd_f32", 3, 5, 7, DType::kF32, 23, 0},
    {"odd_f32_off1", 3, 5, 7, DType::kF32, 23, 1},
};

TEST(CudaKvBlocksTest, GatherAndScatterMatchExportAndImport) {
  BATON_SKIP_WITHOUT_CUDA();
  uint32_t seed = 31;
  for (const KvCase& c : kCases) {
    RunCase(c, seed++);
    ASSERT_FALSE(HasFatalFailure()) << c.name;
  }
}

// Out-of-range ids: the gathered chunk is all 0xFF; scatter leaves the pool
// untouched.
TEST(CudaKvBlocksTest, OutOfRangeIdsNeitherReadNorWrite) {
  BATON_SKIP_WITHOUT_CUDA();
  const KvPoolGeometry geometry{2, 4, 64};
  std::vector<uint8_t> pool(2 * 4 * 64);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(i);
  const std::vector<int32_t> ids = {2, -1, 4, 0};
  DeviceBuffer<uint8_t> d_pool{std::span<const uint8_t>(pool)};
  DeviceBuffer<int32_t> d_ids{std::span<const int32_t>(ids)};
  DeviceBuffer<uint8_t> d_staging(4 * 64);
  d_staging.Poison();
  ASSERT_FALSE(HasFatalFailure());
  BATON_ASSERT_CUDA_OK(GatherKvLayer(d_pool.get(), geometry, 1, d_ids.get(), 4,
                                     d_staging.get(), nullptr));
  const std::vector<uint8_t> staging = d_staging.Download();
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(staging[i], pool[(1 * 4 + 2) * 64 + i]);
    EXPECT_EQ(staging[64 + i], 0xFF);
    EXPECT_EQ(staging[128 + i], 0xFF);
    EXPECT_EQ(staging[192 + i], pool[(1 * 4 + 0) * 64 + i]);
  }
  std::vector<uint8_t> zeros(4 * 64, 0);
  d_staging.Upload(zeros);
  BATON_ASSERT_CUDA_OK(ScatterKvLayer(d_staging.get(), geometry, 0, d_ids.get(),
                                      4, d_pool.get(), nullptr));
  std::vector<uint8_t> want = pool;
  std::fill_n(want.begin() + 2 * 64, 64, 0);
  std::fill_n(want.begin() + 0 * 64, 64, 0);
  const std::vector<uint8_t> got = d_pool.Download();
  EXPECT_EQ(CountDiffs(got.data(), want.data(), want.size(), "bad ids"), 0);
}

// CopyRuns against the same copies done on the host: 300 runs (three
// launches) of random lengths (0 to 70000 bytes) at random source and
// destination offsets, so the 16-byte and the byte paths both run; bytes
// between the destinations stay poisoned.
TEST(CudaKvBlocksTest, CopyRunsMatchesHostCopies) {
  BATON_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  constexpr int kRuns = 300;
  std::vector<uint64_t> lengths(kRuns);
  uint64_t total = 0;
  for (uint64_t& n : lengths) {
    const uint32_t kind = rng() % 4;
    n = kind == 0 ? 0 : kind == 1 ? 65536 : rng() % 70000;
    total += n + 32;
  }
  std::vector<uint8_t> src(total), want(total, 0xAB);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  DeviceBuffer<uint8_t> d_src{std::span<const uint8_t>(src)};
  DeviceBuffer<uint8_t> d_dst(total);
  ASSERT_FALSE(HasFatalFailure());
  BATON_ASSERT_CUDA_OK(cudaMemset(d_dst.get(), 0xAB, total));
  std::vector<CopyRun> runs(kRuns);
  std::vector<uint64_t> src_offsets(kRuns);
  uint64_t dst_at = 0, src_at = 0;
  for (int i = 0; i < kRuns; ++i) {
    // Aligned or not, on either side, independently.
    const uint64_t d_skew = rng() % 2 == 0 ? 16 : 1 + rng() % 15;
    const uint64_t s_skew = rng() % 2 == 0 ? 16 : 1 + rng() % 15;
    dst_at += d_skew;
    src_offsets[i] = (src_at + s_skew) % (total - lengths[i]);
    runs[i] = {d_dst.get() + dst_at, d_src.get() + src_offsets[i], lengths[i]};
    std::memcpy(want.data() + dst_at, src.data() + src_offsets[i], lengths[i]);
    dst_at += lengths[i];
    src_at += 7919;
  }
  ASSERT_LE(dst_at, total);
  BATON_ASSERT_CUDA_OK(CopyRuns(runs.data(), kRuns, nullptr));
  BATON_ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = d_dst.Download();
  const int64_t diffs =
      CountDiffs(got.data(), want.data(), want.size(), "copy runs");
  Report("copy_runs", "300_runs", diffs);
  EXPECT_EQ(diffs, 0);
}

TEST(CudaKvBlocksArgsTest, RejectsBadArgumentsWithoutLaunching) {
  const CopyRun null_dst{nullptr, reinterpret_cast<const void*>(16), 8};
  const CopyRun empty{nullptr, nullptr, 0};
  EXPECT_EQ(CopyRuns(&null_dst, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CopyRuns(nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CopyRuns(&empty, -1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CopyRuns(&empty, 1, nullptr), cudaSuccess);
  EXPECT_EQ(CopyRuns(nullptr, 0, nullptr), cudaSuccess);
  void* fake = reinterpret_cast<void*>(16);
  const int32_t* ids = reinterpret_cast<const int32_t*>(16);
  const KvPoolGeometry good{2, 4, 64};
  EXPECT_EQ(GatherKvLayer(fake, good, 2, ids, 1, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GatherKvLayer(fake, good, -1, ids, 1, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GatherKvLayer(fake, good, 0, ids, -1, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GatherKvLayer(fake, good, 0, nullptr, 1, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ScatterKvLayer(nullptr, good, 0, ids, 1, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      ScatterKvLayer(fake, KvPoolGeometry{0, 4, 64}, 0, ids, 1, fake, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(
      ScatterKvLayer(fake, KvPoolGeometry{2, 4, 0}, 0, ids, 1, fake, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(GatherKvLayer(fake, KvPoolGeometry{2, INT64_MAX / 2, 64}, 0, ids, 1,
                          fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GatherKvLayer(nullptr, good, 0, nullptr, 0, nullptr, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace baton::cuda
