#include "kernels/cuda/gemm.h"

#include <cuda_runtime.h>

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

// Inputs of one product: bit patterns (bf16/f16 storage, or float) and the
// float values they stand for.
struct Operand {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

float Decode(GemmType type, uint16_t bits) {
  return type == GemmType::kBF16 ? BF16ToF32(bits) : F16ToF32(bits);
}

uint16_t Encode(GemmType type, float v) {
  return type == GemmType::kBF16 ? F32ToBF16(v) : F32ToF16(v);
}

// n values uniform in [-1, 1] (or small integers in [-8, 8] if `integers`),
// rounded to `type` (kF32: kept as float).
Operand RandomOperand(GemmType type, size_t n, bool integers,
                      std::mt19937_64& rng) {
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int> integer(-8, 8);
  Operand op;
  op.values.resize(n);
  if (type != GemmType::kF32) op.bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = integers ? static_cast<float>(integer(rng)) : real(rng);
    if (type == GemmType::kF32) {
      op.values[i] = v;
    } else {
      op.bits[i] = Encode(type, v);
      op.values[i] = Decode(type, op.bits[i]);
    }
  }
  return op;
}

// y = x * w^T in double over the rounded inputs; *max_abs_sum is the largest
// sum_k |x[i][k] * w[j][k]|, the scale of float32 accumulation error.
std::vector<double> Reference(const Operand& x, const Operand& w, int64_t m,
                              int64_t n, int64_t k, double* max_abs_sum) {
  std::vector<double> y(static_cast<size_t>(m * n));
  *max_abs_sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      double abs_sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod =
            static_cast<double>(x.values[i * k + p]) * w.values[j * k + p];
        sum += prod;
        abs_sum += std::fabs(prod);
      }
      y[i * n + j] = sum;
      *max_abs_sum = std::max(*max_abs_sum, abs_sum);
    }
  }
  return y;
}

struct Case {
  GemmType in;
  GemmType out;
  int64_t m, n, k;
  bool integers = false;
  bool accumulate = false;
};

std::string OpName(const Case& c) {
  const auto name = [](GemmType t) {
    return t == GemmType::kF32 ? "f32" : t == GemmType::kF16 ? "f16" : "bf16";
  };
  return std::string("gemm_") + name(c.in) + "_" + name(c.out) +
         (c.integers ? "_int" : "") + (c.accumulate ? "_acc" : "");
}

// Runs one product on the device and compares it with Reference().
//
// Tolerance |got - ref| <= atol + |ref| * rtol with
//   atol = k * 2^-23 * max_abs_sum: float32 accumulation of k products
//     errs by at most ~k * u * sum|x*w| (u = 2^-24), doubled for tensor-core
//     accumulation, which may truncate instead of rounding; the products of
//     bf16/f16 inputs are exact in float32. Integer inputs are exact
//     everywhere (|sums| < 2^24), so atol = 0 there.
//   rtol = 0 for a float32 output; 2^-8 for bf16 (half an ulp is 2^-9
//     relative) and 2^-10 for f16 (half an ulp is 2^-11) outputs.
void RunCase(CudaGemm& gemm, const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(OpName(c) + " m=" + std::to_string(c.m) +
               " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k));
  const Operand x = RandomOperand(c.in, c.m * c.k, c.integers, rng);
  const Operand w = RandomOperand(c.in, c.n * c.k, c.integers, rng);
  double max_abs_sum = 0.0;
  std::vector<double> ref = Reference(x, w, c.m, c.n, c.k, &max_abs_sum);
  const size_t ny = static_cast<size_t>(c.m * c.n);

  // Previous y for accumulate: exact small values in the output type.
  std::vector<float> y0(ny, 0.0f);
  if (c.accumulate) {
    std::uniform_int_distribution<int> dist(-4, 4);
    for (size_t i = 0; i < ny; ++i) {
      y0[i] = static_cast<float>(dist(rng));
      ref[i] += y0[i];
    }
  }

  std::vector<float> got;
  if (c.in == GemmType::kF32) {
    DeviceBuffer<float> dx{std::span<const float>(x.values)};
    DeviceBuffer<float> dw{std::span<const float>(w.values)};
    DeviceBuffer<float> dy(ny);
    if (c.accumulate) {
      dy.Upload(y0);
    } else {
      dy.Poison();
    }
    ASSERT_FALSE(testing::Test::HasFatalFailure());
    const absl::Status s = gemm.Matmul(c.in, dx.get(), dw.get(), c.out,
                                       dy.get(), c.m, c.n, c.k, c.accumulate);
    ASSERT_TRUE(s.ok()) << s;
    got = dy.Download();
  } else {
    DeviceBuffer<uint16_t> dx{std::span<const uint16_t>(x.bits)};
    DeviceBuffer<uint16_t> dw{std::span<const uint16_t>(w.bits)};
    if (c.out == GemmType::kF32) {
      DeviceBuffer<float> dy(ny);
      if (c.accumulate) {
        dy.Upload(y0);
      } else {
        dy.Poison();
      }
      ASSERT_FALSE(testing::Test::HasFatalFailure());
      const absl::Status s = gemm.Matmul(c.in, dx.get(), dw.get(), c.out,
                                         dy.get(), c.m, c.n, c.k, c.accumulate);
      ASSERT_TRUE(s.ok()) << s;
      got = dy.Download();
    } else {
      DeviceBuffer<uint16_t> dy(ny);
      std::vector<uint16_t> y0_bits(ny);
      for (size_t i = 0; i < ny; ++i) y0_bits[i] = Encode(c.out, y0[i]);
      if (c.accumulate) {
        dy.Upload(y0_bits);
      } else {
        dy.Poison();
      }
      ASSERT_FALSE(testing::Test::HasFatalFailure());
      const absl::Status s = gemm.Matmul(c.in, dx.get(), dw.get(), c.out,
                                         dy.get(), c.m, c.n, c.k, c.accumulate);
      ASSERT_TRUE(s.ok()) << s;
      const std::vector<uint16_t> bits = dy.Download();
      got.resize(ny);
      for (size_t i = 0; i < ny; ++i) got[i] = Decode(c.out, bits[i]);
    }
  }
  ASSERT_FALSE(testing::Test::HasFatalFailure());

  const double atol =
      c.integers ? 0.0 : static_cast<double>(c.k) * 0x1p-23 * max_abs_sum;
  const double rtol = c.out == GemmType::kBF16  ? 0x1p-8
                      : c.out == GemmType::kF16 ? 0x1p-10
                                                : 0.0;
  const std::vector<float> ref_f(ref.begin(), ref.end());
  const std::string what = OpName(c) + " m" + std::to_string(c.m) + "n" +
                           std::to_string(c.n) + "k" + std::to_string(c.k);
  const cuda_test::MaxError err = ExpectAllClose(got, ref_f, atol, rtol, what);
  std::printf(
      "BATON_KERNEL_ERROR op=%s case=m%lldn%lldk%lld max_abs=%g "
      "atol=%g rtol=%g\n",
      OpName(c).c_str(), static_cast<long long>(c.m),
      static_cast<long long>(c.n), static_cast<long long>(c.k), err.abs, atol,
      rtol);
}

std::unique_ptr<CudaGemm> MakeGemm() {
  absl::StatusOr<std::unique_ptr<CudaGemm>> gemm =
      CudaGemm::Create(/*stream=*/nullptr);
  EXPECT_TRUE(gemm.ok()) << gemm.status();
  return gemm.ok() ? std::move(*gemm) : nullptr;
}

TEST(CudaGemmTest, Bf16ToF32MatchesReferenceOnOddShapes) {
  BATON_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CudaGemm> gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  std::mt19937_64 rng(101);
  for (int64_t m : {1, 7, 19, 64}) {
    for (int64_t n : {1, 989, 2048}) {
      for (int64_t k : {64, 576, 989}) {
        RunCase(*gemm, {GemmType::kBF16, GemmType::kF32, m, n, k}, rng);
      }
    }
  }
}

TEST(CudaGemmTest, Bf16IntegerInputsAreExact) {
  BATON_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CudaGemm> gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  std::mt19937_64 rng(102);
  for (int64_t m : {1, 19, 64}) {
    for (int64_t n : {1, 989}) {
      for (int64_t k : {64, 989}) {
        Case c{GemmType::kBF16, GemmType::kF32, m, n, k};
        c.integers = true;
        RunCase(*gemm, c, rng);
      }
    }
  }
}

TEST(CudaGemmTest, OtherTypePairsMatchReference) {
  BATON_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CudaGemm> gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  std::mt19937_64 rng(103);
  const GemmType pairs[][2] = {{GemmType::kBF16, GemmType::kBF16},
                               {GemmType::kF16, GemmType::kF32},
                               {GemmType::kF16, GemmType::kF16},
                               {GemmType::kF32, GemmType::kF32}};
  for (const auto& pair : pairs) {
    for (int64_t m : {1, 19}) {
      for (int64_t n : {1, 989, 2048}) {
        for (int64_t k : {64, 989}) {
          RunCase(*gemm, {pair[0], pair[1], m, n, k}, rng);
        }
      }
    }
  }
}

TEST(CudaGemmTest, AccumulateAddsToPreviousOutput) {
  BATON_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CudaGemm> gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  std::mt19937_64 rng(104);
  for (GemmType in : {GemmType::kBF16, GemmType::kF32}) {
    Case c{in, GemmType::kF32, 7, 989, 576};
    c.accumulate = true;
    RunCase(*gemm, c, rng);
  }
}

TEST(CudaGemmTest, EmptyProductIsANoOpAndBadArgumentsFail) {
  BATON_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CudaGemm> gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  DeviceBuffer<float> y(4);
  y.Poison();
  EXPECT_TRUE(gemm->MatmulF32(nullptr, nullptr, y.get(), 0, 4, 8).ok());
  EXPECT_EQ(gemm->MatmulF32(nullptr, nullptr, y.get(), 1, 4, 8).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> after = y.Download();
  for (float v : after) EXPECT_TRUE(std::isnan(v)) << "y was written";
}

// Argument checks run on the host; these tests need no device.
TEST(CudaGemmValidationTest, RejectsBadArguments) {
  int dummy = 0;
  const void* p = &dummy;
  void* q = &dummy;
  const auto validate = [&](GemmType in, GemmType out, int64_t m, int64_t n,
                            int64_t k, const void* x, const void* w,
                            const void* y) {
    return CudaGemm::ValidateMatmul(in, x, w, out, y, m, n, k).code();
  };
  using absl::StatusCode;
  const GemmType bf = GemmType::kBF16;
  const GemmType f32 = GemmType::kF32;
  EXPECT_EQ(validate(bf, f32, 7, 989, 989, p, p, q), StatusCode::kOk);
  EXPECT_EQ(validate(bf, GemmType::kBF16, 1, 1, 1, p, p, q), StatusCode::kOk);
  EXPECT_EQ(validate(bf, f32, -1, 8, 8, p, p, q), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, -1, 8, p, p, q), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, 8, -1, p, p, q), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, 8, 0, p, p, q), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, int64_t{1} << 31, 8, 8, p, p, q),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, 8, 8, nullptr, p, q),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, 8, 8, p, nullptr, q),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(bf, f32, 8, 8, 8, p, p, nullptr),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(GemmType::kF16, GemmType::kBF16, 8, 8, 8, p, p, q),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(f32, GemmType::kBF16, 8, 8, 8, p, p, q),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(validate(static_cast<GemmType>(9), f32, 8, 8, 8, p, p, q),
            StatusCode::kInvalidArgument);
  // Empty products need no pointers.
  EXPECT_EQ(validate(bf, f32, 0, 8, 8, nullptr, nullptr, nullptr),
            StatusCode::kOk);
  EXPECT_EQ(validate(bf, f32, 8, 0, 0, nullptr, nullptr, nullptr),
            StatusCode::kOk);
}

}  // namespace
}  // namespace baton::cuda
