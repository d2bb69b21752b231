// Device SwiGLU and residual add against baton::SwiGlu and a host add.
#include "kernels/cuda/activation.h"

#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/cuda_test_util.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;
using ::baton::cuda_test::ExpectAllClose;
using ::baton::cuda_test::MaxError;

// expf on the device is within 2 ulp, glibc's within 1; one division and one
// product follow: rtol 4 * FLT_EPSILON. atol covers results that underflow to
// subnormals.
constexpr double kSwiGluAtol = 1e-37;
constexpr double kSwiGluRtol = 4 * FLT_EPSILON;

// Sizes: a partial float4, odd tails, and more than 256 * 65536 float4s (the
// grid-stride loop).
const int64_t kSizes[] = {1,
                          3,
                          7,
                          19,
                          989,
                          4096,
                          (int64_t{1} << 20) + 3,
                          (int64_t{1} << 26) + 4 * 1000 + 1};

std::vector<float> Random(int64_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// offset: elements by which every device pointer is shifted (1 makes them
// 4-byte but not 16-byte aligned: the scalar path).
void RunSwiGlu(int64_t n, int64_t offset, bool out_is_gate, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> gate = Random(n, 4.0f, rng);
  const std::vector<float> up = Random(n, 1.0f, rng);
  if (n >= 4) {
    gate[0] = -80.0f;  // exp(80) is finite in float
    gate[1] = 80.0f;
    gate[2] = 0.0f;
    gate[3] = -1e-30f;
  }
  std::vector<float> ref(n);
  ::baton::SwiGlu(gate.data(), up.data(), n, ref.data());

  std::vector<float> padded_gate(offset, 0.0f), padded_up(offset, 0.0f);
  padded_gate.insert(padded_gate.end(), gate.begin(), gate.end());
  padded_up.insert(padded_up.end(), up.begin(), up.end());
  DeviceBuffer<float> d_gate{std::span<const float>(padded_gate)};
  DeviceBuffer<float> d_up{std::span<const float>(padded_up)};
  DeviceBuffer<float> d_out(n + offset);
  d_out.Poison();
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  float* out = out_is_gate ? d_gate.get() + offset : d_out.get() + offset;
  BATON_ASSERT_CUDA_OK(
      SwiGlu(d_gate.get() + offset, d_up.get() + offset, n, out, nullptr));
  std::vector<float> got = out_is_gate ? d_gate.Download() : d_out.Download();
  got.erase(got.begin(), got.begin() + offset);
  const std::string what = "n" + std::to_string(n) + "_off" +
                           std::to_string(offset) +
                           (out_is_gate ? "_out_is_gate" : "");
  const MaxError err = ExpectAllClose(got, ref, kSwiGluAtol, kSwiGluRtol, what);
  std::printf(
      "BATON_KERNEL_ERROR op=swiglu case=%s max_abs=%g atol=%g rtol=%g\n",
      what.c_str(), err.abs, kSwiGluAtol, kSwiGluRtol);
}

TEST(CudaSwiGluTest, MatchesCpu) {
  BATON_SKIP_WITHOUT_CUDA();
  uint32_t seed = 5;
  for (int64_t n : kSizes) {
    for (int64_t offset : {0, 1}) {
      RunSwiGlu(n, offset, /*out_is_gate=*/false, seed++);
      ASSERT_FALSE(HasFatalFailure());
    }
  }
  RunSwiGlu(989, 0, /*out_is_gate=*/true, seed++);
}

TEST(CudaAddInPlaceTest, MatchesHostAddExactly) {
  BATON_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(17);
  for (int64_t n : kSizes) {
    for (int64_t offset : {0, 1}) {
      const int64_t total = n + offset;
      const std::vector<float> x = Random(total, 3.0f, rng);
      const std::vector<float> y = Random(total, 1.0f, rng);
      std::vector<float> ref = x;
      for (int64_t i = offset; i < total; ++i) ref[i] = x[i] + y[i];
      DeviceBuffer<float> d_x{std::span<const float>(x)};
      DeviceBuffer<float> d_y{std::span<const float>(y)};
      ASSERT_FALSE(HasFatalFailure());
      BATON_ASSERT_CUDA_OK(
          AddInPlace(d_x.get() + offset, d_y.get() + offset, n, nullptr));
      // One float rounding on both sides: exact (atol 0, rtol 0); the
      // element before the range must be untouched.
      const std::string what =
          "n" + std::to_string(n) + "_off" + std::to_string(offset);
      const MaxError err = ExpectAllClose(d_x.Download(), ref, 0.0, 0.0, what);
      std::printf(
          "BATON_KERNEL_ERROR op=add case=%s max_abs=%g atol=0 rtol=0\n",
          what.c_str(), err.abs);
    }
  }
}

TEST(CudaActivationArgsTest, RejectsBadArgumentsWithoutLaunching) {
  float* fake = reinterpret_cast<float*>(16);
  EXPECT_EQ(SwiGlu(fake, fake, -1, fake, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(SwiGlu(nullptr, fake, 4, fake, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(SwiGlu(fake, fake, 4, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(AddInPlace(fake, nullptr, 4, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(AddInPlace(fake, fake, -2, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(AddInPlace(nullptr, nullptr, 0, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace baton::cuda
