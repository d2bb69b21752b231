// Device dequantization against baton::DequantizeRow, bit for bit.
#include "kernels/cuda/dequantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/cuda_test_util.h"
#include "model/tensor.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;

const DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                        DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                        DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                        DType::kQ6_K};

// Byte offsets of the half-precision scale fields inside one block.
std::vector<int> HalfFieldOffsets(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
      return {0};
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return {0, 2};
    case DType::kQ2_K:
      return {80, 82};
    case DType::kQ3_K:
      return {108};
    case DType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Random bytes for `blocks` blocks of dtype, with every float field finite
// (scales may be subnormal, negative or zero).
std::vector<uint8_t> RandomBlocks(DType dtype, int64_t blocks,
                                  std::mt19937& rng) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  std::vector<uint8_t> bytes(blocks * info.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  const auto fix_half = [&](size_t at) {
    uint16_t h;
    std::memcpy(&h, &bytes[at], 2);
    if (((h >> 10) & 0x1F) == 0x1F) h &= ~uint16_t{0x0400};
    std::memcpy(&bytes[at], &h, 2);
  };
  if (dtype == DType::kF32) {
    for (size_t at = 0; at < bytes.size(); at += 4) {
      uint32_t f;
      std::memcpy(&f, &bytes[at], 4);
      if (((f >> 23) & 0xFF) == 0xFF) f &= ~uint32_t{1} << 23;
      std::memcpy(&bytes[at], &f, 4);
    }
  } else if (dtype == DType::kF16) {
    for (size_t at = 0; at < bytes.size(); at += 2) fix_half(at);
  } else if (dtype == DType::kBF16) {
    for (size_t at = 0; at < bytes.size(); at += 2) {
      uint16_t h;
      std::memcpy(&h, &bytes[at], 2);
      if (((h >> 7) & 0xFF) == 0xFF) h &= ~uint16_t{0x0080};
      std::memcpy(&bytes[at], &h, 2);
    }
  } else {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int off : HalfFieldOffsets(dtype)) {
        fix_half(b * info.block_bytes + off);
      }
    }
  }
  return bytes;
}

// Dequantizes `blocks` random blocks at byte offset `misalign` of the device
// buffer to float32 and to bfloat16 and compares bit patterns with the CPU.
void RunCase(DType dtype, int64_t blocks, int misalign, uint32_t seed) {
  std::mt19937 rng(seed);
  const DTypeInfo& info = GetDTypeInfo(dtype);
  const int64_t n = blocks * info.block_size;
  std::vector<uint8_t> src = RandomBlocks(dtype, blocks, rng);
  std::vector<float> ref(n);
  ASSERT_TRUE(DequantizeRow(dtype, src.data(), ref.data(), n).ok());
  for (float v : ref) ASSERT_TRUE(std::isfinite(v));
  src.insert(src.begin(), misalign, uint8_t{0});

  DeviceBuffer<uint8_t> d_src{std::span<const uint8_t>(src)};
  DeviceBuffer<float> d_f32(n);
  DeviceBuffer<uint16_t> d_bf16(n);
  d_f32.Poison();
  d_bf16.Poison();
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  BATON_ASSERT_CUDA_OK(
      DequantizeToF32(dtype, d_src.get() + misalign, n, d_f32.get(), nullptr));
  BATON_ASSERT_CUDA_OK(DequantizeToBF16(dtype, d_src.get() + misalign, n,
                                        d_bf16.get(), nullptr));
  const std::vector<float> got = d_f32.Download();
  const std::vector<uint16_t> got_bf16 = d_bf16.Download();
  ASSERT_EQ(got.size(), ref.size());

  // Same operations in the same order with no fused multiply-add: the
  // float32 bits must match exactly (atol 0, rtol 0; stricter than the
  // rtol 1e-7 budget, and -0 versus +0 counts as a difference).
  int64_t f32_diffs = 0, bf16_diffs = 0;
  double max_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(ref[i])) {
      if (f32_diffs++ == 0) {
        ADD_FAILURE() << info.name << " element " << i << ": device " << got[i]
                      << ", cpu " << ref[i];
      }
      max_abs = std::max(max_abs, std::fabs(double{got[i]} - ref[i]));
      if (std::isnan(got[i])) max_abs = INFINITY;
    }
    if (got_bf16[i] != F32ToBF16(ref[i])) {
      if (bf16_diffs++ == 0) {
        ADD_FAILURE() << info.name << " bf16 element " << i << ": device 0x"
                      << std::hex << got_bf16[i] << ", cpu 0x"
                      << F32ToBF16(ref[i]);
      }
    }
  }
  EXPECT_EQ(f32_diffs, 0) << info.name;
  EXPECT_EQ(bf16_diffs, 0) << info.name;
  const std::string what = std::string(info.name) + "_b" +
                           std::to_string(blocks) + "_off" +
                           std::to_string(misalign);
  std::printf(
      "BATON_KERNEL_ERROR op=dequantize_f32 case=%s max_abs=%g atol=0 "
      "rtol=0\n",
      what.c_str(), max_abs);
  std::printf(
      "BATON_KERNEL_ERROR op=dequantize_bf16 case=%s max_abs=%lld atol=0 "
      "rtol=0\n",
      what.c_str(), static_cast<long long>(bf16_diffs));
}

TEST(CudaDequantizeTest, BitExactWithCpuForEveryType) {
  BATON_SKIP_WITHOUT_CUDA();
  uint32_t seed = 21;
  for (DType dtype : kTypes) {
    for (int64_t blocks : {1, 7, 19, 989}) {
      for (int misalign : {0, 1}) {
        RunCase(dtype, blocks, misalign, seed++);
        ASSERT_FALSE(HasFatalFailure()) << DTypeName(dtype);
      }
    }
  }
}

// More elements than 256 * 65536 launched threads: the grid-stride loop.
TEST(CudaDequantizeTest, LargeTensorsUseTheGridStrideLoop) {
  BATON_SKIP_WITHOUT_CUDA();
  RunCase(DType::kQ4_1, 600000, 0, 77);
  RunCase(DType::kQ6_K, 70000, 3, 78);
}

// The device covers exactly the CPU's types and rejects counts that are not
// multiples of model/tensor.h's block size (block_bytes is covered by the
// device tests, which lay blocks out with DTypeInfo).
TEST(CudaDequantizeArgsTest, SupportsTheCpuTypesAndChecksArguments) {
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = FindDTypeInfo(id);
    if (info == nullptr) continue;
    EXPECT_EQ(CanDequantizeOnDevice(info->dtype), CanDequantize(info->dtype))
        << info->name;
    if (!CanDequantizeOnDevice(info->dtype)) {
      EXPECT_EQ(DequantizeToF32(info->dtype, &id, info->block_size,
                                reinterpret_cast<float*>(16), nullptr),
                cudaErrorInvalidValue)
          << info->name;
      continue;
    }
    float* dst = reinterpret_cast<float*>(16);
    // A count that is not a multiple of the block size, negative, or null
    // pointers: rejected before any launch.
    if (info->block_size > 1) {
      EXPECT_EQ(
          DequantizeToF32(info->dtype, &id, info->block_size + 1, dst, nullptr),
          cudaErrorInvalidValue)
          << info->name;
    }
    EXPECT_EQ(
        DequantizeToF32(info->dtype, &id, -info->block_size, dst, nullptr),
        cudaErrorInvalidValue);
    EXPECT_EQ(
        DequantizeToF32(info->dtype, nullptr, info->block_size, dst, nullptr),
        cudaErrorInvalidValue);
    EXPECT_EQ(
        DequantizeToBF16(info->dtype, &id, info->block_size, nullptr, nullptr),
        cudaErrorInvalidValue);
    EXPECT_EQ(DequantizeToF32(info->dtype, nullptr, 0, nullptr, nullptr),
              cudaSuccess);
  }
}

}  // namespace
}  // namespace baton::cuda
