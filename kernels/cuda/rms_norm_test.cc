// Device RMSNorm and fused add + RMSNorm against baton::RmsNorm.
#include "kernels/cuda/rms_norm.h"

#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cuda/cuda_test_util.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;
using ::baton::cuda_test::ExpectAllClose;
using ::baton::cuda_test::MaxError;

// The device's double sum of squares differs from the CPU's only in order, so
// the float scale is equal or one ulp apart and y = (x * s) * w is within a
// few float ulp: atol 0, rtol 4 * FLT_EPSILON.
constexpr double kAtol = 0.0;
constexpr double kRtol = 4 * FLT_EPSILON;
constexpr float kEps = 1e-5f;

std::vector<float> Random(int64_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

void Report(const char* op, const std::string& what, const MaxError& err) {
  std::printf("BATON_KERNEL_ERROR op=%s case=%s max_abs=%g atol=%g rtol=%g\n",
              op, what.c_str(), err.abs, kAtol, kRtol);
}

std::string Case(int64_t tokens, int64_t dim, const char* suffix = "") {
  return "t" + std::to_string(tokens) + "_d" + std::to_string(dim) + suffix;
}

// Shapes covering one partial warp, several warps, exactly 1024 threads with
// a tail, and more rows than launched blocks.
const int64_t kShapes[][2] = {{1, 1},   {7, 7},    {19, 19},  {3, 989},
                              {4, 576}, {2, 1024}, {5, 4099}, {70000, 33}};

TEST(CudaRmsNormTest, MatchesCpuForOddShapes) {
  BATON_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  for (const auto& s : kShapes) {
    const int64_t tokens = s[0], dim = s[1];
    const std::vector<float> x = Random(tokens * dim, 3.0f, rng);
    const std::vector<float> w = Random(dim, 1.0f, rng);
    std::vector<float> ref(tokens * dim);
    ::baton::RmsNorm(x.data(), w.data(), tokens, dim, kEps, ref.data());

    DeviceBuffer<float> d_x{std::span<const float>(x)};
    DeviceBuffer<float> d_w{std::span<const float>(w)};
    DeviceBuffer<float> d_y(tokens * dim);
    d_y.Poison();
    ASSERT_FALSE(HasFatalFailure());
    BATON_ASSERT_CUDA_OK(
        RmsNorm(d_x.get(), d_w.get(), tokens, dim, kEps, d_y.get(), nullptr));
    Report(
        "rms_norm", Case(tokens, dim),
        ExpectAllClose(d_y.Download(), ref, kAtol, kRtol, Case(tokens, dim)));
    // In place: y aliases x.
    BATON_ASSERT_CUDA_OK(
        RmsNorm(d_x.get(), d_w.get(), tokens, dim, kEps, d_x.get(), nullptr));
    Report("rms_norm", Case(tokens, dim, "_inplace"),
           ExpectAllClose(d_x.Download(), ref, kAtol, kRtol,
                          Case(tokens, dim, "_inplace")));
  }
}

// A row's result does not depend on the other rows of the batch.
TEST(CudaRmsNormTest, RowsAreBitIdenticalAloneAndInABatch) {
  BATON_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  const int64_t tokens = 13, dim = 989;
  const std::vector<float> x = Random(tokens * dim, 2.0f, rng);
  const std::vector<float> w = Random(dim, 1.0f, rng);
  DeviceBuffer<float> d_x{std::span<const float>(x)};
  DeviceBuffer<float> d_w{std::span<const float>(w)};
  DeviceBuffer<float> d_all(tokens * dim);
  DeviceBuffer<float> d_one(dim);
  d_all.Poison();
  d_one.Poison();
  ASSERT_FALSE(HasFatalFailure());
  BATON_ASSERT_CUDA_OK(
      RmsNorm(d_x.get(), d_w.get(), tokens, dim, kEps, d_all.get(), nullptr));
  BATON_ASSERT_CUDA_OK(RmsNorm(d_x.get() + 5 * dim, d_w.get(), 1, dim, kEps,
                               d_one.get(), nullptr));
  const std::vector<float> all = d_all.Download();
  const std::vector<float> one = d_one.Download();
  for (int64_t i = 0; i < dim; ++i) {
    ASSERT_EQ(one[i], all[5 * dim + i]) << "element " << i;
  }
}

// x += delta exactly as a float add; y = RmsNorm(new x), also with y aliasing
// delta.
TEST(CudaRmsNormTest, AddRmsNormMatchesAddThenCpuNorm) {
  BATON_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(13);
  for (const auto& s : kShapes) {
    const int64_t tokens = s[0], dim = s[1];
    const std::vector<float> x = Random(tokens * dim, 3.0f, rng);
    const std::vector<float> delta = Random(tokens * dim, 1.0f, rng);
    const std::vector<float> w = Random(dim, 1.0f, rng);
    std::vector<float> sum(tokens * dim), ref(tokens * dim);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + delta[i];
    ::baton::RmsNorm(sum.data(), w.data(), tokens, dim, kEps, ref.data());

    for (bool alias_delta : {false, true}) {
      DeviceBuffer<float> d_x{std::span<const float>(x)};
      DeviceBuffer<float> d_delta{std::span<const float>(delta)};
      DeviceBuffer<float> d_w{std::span<const float>(w)};
      DeviceBuffer<float> d_y(tokens * dim);
      d_y.Poison();
      ASSERT_FALSE(HasFatalFailure());
      float* y = alias_delta ? d_delta.get() : d_y.get();
      BATON_ASSERT_CUDA_OK(AddRmsNorm(d_x.get(), d_delta.get(), d_w.get(),
                                      tokens, dim, kEps, y, nullptr));
      const std::string what =
          Case(tokens, dim, alias_delta ? "_y_is_delta" : "");
      // The residual add is one float rounding: exact.
      const MaxError add_err =
          ExpectAllClose(d_x.Download(), sum, 0.0, 0.0, what + "_x");
      std::printf(
          "BATON_KERNEL_ERROR op=add_rms_norm_residual case=%s max_abs=%g "
          "atol=0 rtol=0\n",
          what.c_str(), add_err.abs);
      const std::vector<float> got =
          alias_delta ? d_delta.Download() : d_y.Download();
      Report("add_rms_norm", what,
             ExpectAllClose(got, ref, kAtol, kRtol, what + "_y"));
    }
  }
}

TEST(CudaRmsNormArgsTest, RejectsBadArgumentsWithoutLaunching) {
  float* fake = reinterpret_cast<float*>(16);
  EXPECT_EQ(RmsNorm(fake, fake, -1, 4, kEps, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(RmsNorm(fake, fake, 1, -4, kEps, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(RmsNorm(fake, nullptr, 1, 4, kEps, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(RmsNorm(fake, fake, INT64_MAX / 2, 4, kEps, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(AddRmsNorm(fake, nullptr, fake, 1, 4, kEps, fake, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(AddRmsNorm(nullptr, nullptr, nullptr, 0, 4, kEps, nullptr, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace baton::cuda
