// RepackForCpuMatMul: every repacked layout holds exactly the values of the
// blocks it came from (the dequantizations agree bit for bit), and bad
// views are refused.
#include "kernels/cpu/repack.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/float16.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

struct Source {
  DType dtype;
  DType target;
  std::vector<int> f16_offsets;  // the block's f16 scales
};

const Source kSources[] = {
    {DType::kQ4_K, DType::kQ4_KR, {0, 2}},
    {DType::kQ5_K, DType::kQ5_KR, {0, 2}},
    {DType::kQ5_1, DType::kQ5_KR, {0, 2}},
    {DType::kQ6_K, DType::kQ6_KR, {208}},
    {DType::kQ3_K, DType::kQ6_KR, {108}},
    {DType::kQ5_0, DType::kQ8_0, {0}},
};

// Random blocks: random code and scale bytes, finite f16 scales of
// magnitudes across the range weights use (zero included).
std::vector<uint8_t> RandomBlocks(const Source& s, int64_t blocks,
                                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t bytes = GetDTypeInfo(s.dtype).block_bytes;
  std::vector<uint8_t> b(static_cast<size_t>(blocks * bytes));
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < blocks; ++i) {
    for (int off : s.f16_offsets) {
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 16);
      const uint16_t h = F32ToF16(i % 7 == 3 ? 0.0f : u(rng) * scale);
      std::memcpy(&b[static_cast<size_t>(i * bytes + off)], &h, 2);
    }
  }
  return b;
}

TEST(RepackTest, EveryLayoutDequantizesToTheSourceBits) {
  for (const Source& s : kSources) {
    ASSERT_EQ(CpuMatMulRepackTarget(s.dtype), s.target) << DTypeName(s.dtype);
    for (const int64_t rows : {1, 3}) {
      for (const int64_t k : {256, 768, 2048}) {
        const int64_t n = rows * k;
        std::vector<uint8_t> src = RandomBlocks(
            s, n / GetDTypeInfo(s.dtype).block_size,
            static_cast<uint32_t>(n) + static_cast<uint32_t>(s.dtype));
        TensorView view;
        view.name = "blk.0.ffn_up.weight";
        view.dtype = s.dtype;
        view.shape = {rows, k};
        view.data = src.data();
        view.nbytes = src.size();
        absl::StatusOr<std::vector<uint8_t>> out = RepackForCpuMatMul(view);
        ASSERT_TRUE(out.ok()) << out.status();
        const DTypeInfo& t = GetDTypeInfo(s.target);
        EXPECT_EQ(out->size(),
                  static_cast<size_t>(n / t.block_size * t.block_bytes));
        std::vector<float> want(n), got(n);
        ASSERT_TRUE(DequantizeRow(s.dtype, src.data(), want.data(), n).ok());
        ASSERT_TRUE(DequantizeRow(s.target, out->data(), got.data(), n).ok());
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
            << DTypeName(s.dtype) << " " << rows << " x " << k;
      }
    }
  }
}

TEST(RepackTest, RefusesOtherTypesAndShortViews) {
  std::vector<uint8_t> bytes(2 * 144);
  TensorView view;
  view.name = "w";
  view.dtype = DType::kQ4_1;
  view.shape = {1, 512};
  view.data = bytes.data();
  view.nbytes = bytes.size();
  EXPECT_FALSE(CpuMatMulRepackTarget(DType::kQ4_1).has_value());
  EXPECT_THAT(RepackForCpuMatMul(view).status().message(),
              HasSubstr("Q4_1 is not repacked"));
  view.dtype = DType::kQ4_K;
  view.nbytes = bytes.size() - 1;
  const absl::Status short_view = RepackForCpuMatMul(view).status();
  EXPECT_EQ(short_view.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_view.message(), HasSubstr("needs 288 bytes"));
}

}  // namespace
}  // namespace baton
