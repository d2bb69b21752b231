// Device embedding gather against the host reference (the table row, widened
// with kernels/cpu/float16.h).
#include "kernels/cuda/embedding.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/cuda_test_util.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;
using ::baton::cuda_test::ExpectAllClose;
using ::baton::cuda_test::MaxError;

enum class Table { kF32, kBF16, kF16 };

const char* TableName(Table t) {
  return t == Table::kF32 ? "f32" : (t == Table::kBF16 ? "bf16" : "f16");
}

// Gathers `ids` from a random table of type `type` on the device and expects
// the exact rows; ids outside [0, vocab) must come back as NaN rows.
void RunCase(Table type, int64_t tokens, int64_t vocab, int64_t dim,
             bool with_bad_ids, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> table_f32(vocab * dim);
  std::vector<uint16_t> table_u16(vocab * dim);
  std::vector<float> widened(vocab * dim);
  for (size_t i = 0; i < table_f32.size(); ++i) {
    const float v = normal(rng);
    table_f32[i] = v;
    table_u16[i] = type == Table::kBF16 ? F32ToBF16(v) : F32ToF16(v);
    widened[i] = type == Table::kF32    ? v
                 : type == Table::kBF16 ? BF16ToF32(table_u16[i])
                                        : F16ToF32(table_u16[i]);
  }
  std::uniform_int_distribution<int32_t> pick(0,
                                              static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(tokens);
  for (int32_t& id : ids) id = pick(rng);
  ids[0] = static_cast<int32_t>(vocab - 1);
  if (tokens > 1) ids[1] = 0;
  if (with_bad_ids) {
    ids[0] = -1;
    ids[tokens - 1] = static_cast<int32_t>(vocab);
  }
  std::vector<float> ref(tokens * dim);
  for (int64_t t = 0; t < tokens; ++t) {
    const bool bad = ids[t] < 0 || ids[t] >= vocab;
    for (int64_t i = 0; i < dim; ++i) {
      ref[t * dim + i] = bad ? NAN : widened[ids[t] * dim + i];
    }
  }

  DeviceBuffer<int32_t> d_ids{std::span<const int32_t>(ids)};
  DeviceBuffer<float> d_f32{std::span<const float>(table_f32)};
  DeviceBuffer<uint16_t> d_u16{std::span<const uint16_t>(table_u16)};
  DeviceBuffer<float> d_out(tokens * dim);
  d_out.Poison();
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  switch (type) {
    case Table::kF32:
      BATON_ASSERT_CUDA_OK(EmbeddingF32(d_ids.get(), tokens, d_f32.get(), vocab,
                                        dim, d_out.get(), nullptr));
      break;
    case Table::kBF16:
      BATON_ASSERT_CUDA_OK(EmbeddingBF16(d_ids.get(), tokens, d_u16.get(),
                                         vocab, dim, d_out.get(), nullptr));
      break;
    case Table::kF16:
      BATON_ASSERT_CUDA_OK(EmbeddingF16(d_ids.get(), tokens, d_u16.get(), vocab,
                                        dim, d_out.get(), nullptr));
      break;
  }
  std::vector<float> got = d_out.Download();
  const std::string what = std::string(TableName(type)) + "_t" +
                           std::to_string(tokens) + "_v" +
                           std::to_string(vocab) + "_d" + std::to_string(dim);
  if (with_bad_ids) {
    // Rows of bad ids: NaN; the rest exact.
    std::vector<float> good_got, good_ref;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        if (std::isnan(ref[t * dim + i])) {
          EXPECT_TRUE(std::isnan(got[t * dim + i])) << what << " token " << t;
        } else {
          good_got.push_back(got[t * dim + i]);
          good_ref.push_back(ref[t * dim + i]);
        }
      }
    }
    got = good_got;
    ref = good_ref;
  }
  // Exact: a copy plus an exact widening. atol 0, rtol 0.
  const MaxError err = ExpectAllClose(got, ref, 0.0, 0.0, what);
  std::printf(
      "BATON_KERNEL_ERROR op=embedding_%s case=%s max_abs=%g atol=0 rtol=0\n",
      TableName(type), what.c_str(), err.abs);
}

TEST(CudaEmbeddingTest, MatchesTableRowsForOddShapes) {
  BATON_SKIP_WITHOUT_CUDA();
  const int64_t shapes[][3] = {// tokens, vocab, dim
                               {1, 1, 1},    {7, 19, 7},   {19, 7, 19},
                               {5, 50, 989}, {3, 40, 576}, {2, 3, 1025},
                               {70000, 9, 3}};  // more rows than blocks
  uint32_t seed = 1;
  for (Table type : {Table::kF32, Table::kBF16, Table::kF16}) {
    for (const auto& s : shapes) {
      RunCase(type, s[0], s[1], s[2], /*with_bad_ids=*/false, seed++);
      ASSERT_FALSE(HasFatalFailure());
    }
  }
}

TEST(CudaEmbeddingTest, OutOfRangeIdsGiveNaNRows) {
  BATON_SKIP_WITHOUT_CUDA();
  for (Table type : {Table::kF32, Table::kBF16, Table::kF16}) {
    RunCase(type, 9, 31, 77, /*with_bad_ids=*/true, 100);
    ASSERT_FALSE(HasFatalFailure());
  }
}

// Argument checks happen on the host before any launch, so these run
// without a device.
TEST(CudaEmbeddingArgsTest, RejectsBadArgumentsWithoutLaunching) {
  float* fake = reinterpret_cast<float*>(16);
  const int32_t* ids = reinterpret_cast<const int32_t*>(16);
  EXPECT_EQ(EmbeddingF32(ids, -1, fake, 4, 4, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingF32(ids, 1, fake, -4, 4, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingF32(nullptr, 1, fake, 4, 4, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingBF16(ids, 1, nullptr, 4, 4, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingF16(ids, 1, nullptr, 4, 4, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingF32(ids, 1, fake, INT64_MAX / 2, 4, fake, nullptr),
            cudaErrorInvalidValue);
  // Nothing to do: success without touching the pointers.
  EXPECT_EQ(EmbeddingF32(nullptr, 0, nullptr, 4, 4, nullptr, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace baton::cuda
