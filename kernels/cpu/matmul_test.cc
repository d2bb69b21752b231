#include "kernels/cpu/matmul.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/thread_pool.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr DType kDTypes[] = {DType::kQ4_0,  DType::kQ4_1,  DType::kQ8_0,
                             DType::kQ4_KR, DType::kQ5_KR, DType::kQ6_KR,
                             DType::kF16,   DType::kF32};

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : kAllCpuIsas) {
    if (IsCpuIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

std::unique_ptr<ThreadPool> MakePool(int threads) {
  ThreadPoolOptions options;
  options.num_threads = threads;
  return std::move(ThreadPool::Create(options)).value();
}

// A weight with random contents, plus its exact dequantization split as
// w[r][i] = a[r][i] + c[r][i] where a = d * q (q the stored integer code) and
// c = the block's additive term (Q4_1's and Q4_K_R's m, -8 d for Q4_0, 0
// otherwise): the
// kernels accumulate the two parts separately, so |a| + |c| bounds the size
// of what they add up.
struct TestWeight {
  std::vector<uint8_t> bytes;
  TensorView view;
  std::vector<double> a, c;  // [rows][k]
  double W(int64_t r, int64_t i) const {
    return a[r * K() + i] + c[r * K() + i];
  }
  int64_t K() const { return view.shape[1]; }
};

void PutF16(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

TestWeight MakeWeight(DType dtype, int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  TestWeight w;
  const DTypeInfo& info = GetDTypeInfo(dtype);
  const int64_t row_bytes = k / info.block_size * info.block_bytes;
  w.bytes.resize(rows * row_bytes);
  w.a.assign(rows * k, 0.0);
  w.c.assign(rows * k, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * row_bytes;
    for (int64_t b = 0; b < k / info.block_size; ++b) {
      uint8_t* blk = row + b * info.block_bytes;
      const int64_t i0 = r * k + b * info.block_size;
      if (dtype == DType::kF32) {
        const float v = u(rng) * 0.5f;
        std::memcpy(blk, &v, 4);
        w.a[i0] = v;
        continue;
      }
      if (dtype == DType::kF16) {
        PutF16(blk, u(rng) * 0.5f);
        uint16_t h;
        std::memcpy(&h, blk, 2);
        w.a[i0] = F16ToF32(h);
        continue;
      }
      if (dtype == DType::kQ5_KR) {  // f32 d and m, code bytes 0..31
        const float fd = u(rng) * 0.01f;
        const float fm = u(rng) * 0.1f;
        std::memcpy(blk, &fd, 4);
        std::memcpy(blk + 4, &fm, 4);
        for (int i = 0; i < 32; ++i) {
          const int q = static_cast<int>(rng() % 32);
          blk[8 + i] = static_cast<uint8_t>(q);
          w.a[i0 + i] = static_cast<double>(fd) * q;
          w.c[i0 + i] = fm;
        }
        continue;
      }
      if (dtype == DType::kQ6_KR) {  // two f32 half scales, int8 codes
        const float sc[2] = {u(rng) * 0.02f, u(rng) * 0.02f};
        std::memcpy(blk, sc, sizeof(sc));
        for (int i = 0; i < 32; ++i) {
          const int q = static_cast<int>(rng() % 64) - 32;
          blk[8 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
          w.a[i0 + i] = static_cast<double>(sc[i / 16]) * q;
        }
        continue;
      }
      double d = 0.0;
      double c = 0.0;
      if (dtype == DType::kQ4_KR) {  // f32 d and m, as repack.h writes
        const float fd = u(rng) * 0.02f;
        const float fm = u(rng) * 0.1f;
        std::memcpy(blk, &fd, 4);
        std::memcpy(blk + 4, &fm, 4);
        d = fd;
        c = fm;
      } else {
        PutF16(blk, u(rng) * 0.02f);
        uint16_t hd;
        std::memcpy(&hd, blk, 2);
        d = F16ToF32(hd);
      }
      if (dtype == DType::kQ4_1) {
        PutF16(blk + 2, u(rng) * 0.1f);
        uint16_t hm;
        std::memcpy(&hm, blk + 2, 2);
        c = F16ToF32(hm);
      }
      if (dtype == DType::kQ4_0) c = -8.0 * d;
      for (int i = 0; i < 32; ++i) {
        int q;
        if (dtype == DType::kQ8_0) {
          q = static_cast<int>(rng() % 256) - 128;
          blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
        } else {
          const int qs_offset = dtype == DType::kQ4_1    ? 4
                                : dtype == DType::kQ4_KR ? 8
                                                         : 2;
          q = static_cast<int>(rng() % 16);
          uint8_t& byte = blk[qs_offset + (i % 16)];
          byte = i < 16 ? static_cast<uint8_t>((byte & 0xf0) | q)
                        : static_cast<uint8_t>((byte & 0x0f) | (q << 4));
        }
        w.a[i0 + i] = d * q;
        w.c[i0 + i] = c;
      }
    }
  }
  w.view.name = "test.weight";
  w.view.dtype = dtype;
  w.view.shape = {rows, k};
  w.view.data = w.bytes.data();
  w.view.nbytes = w.bytes.size();
  return w;
}

std::vector<float> MakeInput(int64_t tokens, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(tokens * k);
  for (float& v : x) v = n(rng);
  // Some outliers, as real activations have.
  for (int64_t i = 0; i < tokens * k; i += 97) x[i] *= 20.0f;
  return x;
}

bool IsQuantizedType(DType d) { return d != DType::kF32 && d != DType::kF16; }

// Checks y against double-precision references. For quantized weights, with
// d_a, q, s_a the activation block scale, codes and stored block sum
// (quantize_activations.h) and w_i = a_i + c_i (c = the block's min term):
//  * strict: |y - (sum_i a_i * d_a * q_i + sum_b c_b * s_a[b])| <= R, the
//    kernel's own arithmetic in exact form, with R = 2 * (nb/2 + nb/16 + 8) *
//    2^-24 * sum_i (|a_i| + |c_i|) |d_a q_i| (one rounding per f32 fma in a
//    lane's chain of at most nb/2 + nb/16 terms, plus the lane merge and the
//    4-level horizontal sum; factor 2 slack);
//  * against the f32 input: |y - sum_i w_i * x_i| <= R + Q with
//    Q = sum_blocks (0.57 * d_a) * sum_{i in block} |w_i| + |c_b s_b| 2^-10:
//    rounding to the nearest code moves x_i by at most d'/2 and the scale is
//    stored at half precision (d' = d_a (1 +- 2^-11), 127 codes), and the
//    stored sum s_b is within 2^-11 of d' * sum(q).
// For F32/F16 weights: |y - sum w x| <= 2 * (k/16 + 8) * 2^-24 * sum |w x|.
void CheckAgainstReference(const TestWeight& w, const std::vector<float>& x,
                           int64_t tokens, const std::vector<float>& y) {
  const int64_t rows = w.view.shape[0], k = w.K(), nb = k / 32;
  const double u = std::ldexp(1.0, -24);
  Q8Activations q8;
  ASSERT_TRUE(
      QuantizeActivations(x.data(), tokens, k, &q8, nullptr, CpuIsa::kScalar)
          .ok());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref_x = 0, ref_q = 0, mag = 0, qerr = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double xi = x[t * k + i];
        const double xq =
            static_cast<double>(q8.scales(t)[i / 32]) * q8.quants(t)[i];
        ref_x += w.W(r, i) * xi;
        ref_q += IsQuantizedType(w.view.dtype) ? w.a[r * k + i] * xq : 0.0;
        mag += IsQuantizedType(w.view.dtype)
                   ? (std::fabs(w.a[r * k + i]) + std::fabs(w.c[r * k + i])) *
                         std::fabs(xq)
                   : std::fabs(w.W(r, i) * xi);
        qerr += 0.57 * q8.scales(t)[i / 32] * std::fabs(w.W(r, i));
        if (i % 32 == 0) {
          const double cs = w.c[r * k + i] * q8.sums(t)[i / 32];
          ref_q += cs;
          qerr += std::fabs(cs) * std::ldexp(1.0, -10);
        }
      }
      const double got = y[t * rows + r];
      if (IsQuantizedType(w.view.dtype)) {
        const double round = 2.0 * (nb / 2.0 + nb / 16.0 + 8) * u * mag + 1e-30;
        ASSERT_LE(std::fabs(got - ref_q), round)
            << DTypeName(w.view.dtype) << " r " << r << " t " << t << " k "
            << k;
        ASSERT_LE(std::fabs(got - ref_x), round + qerr)
            << DTypeName(w.view.dtype) << " r " << r << " t " << t << " k "
            << k;
      } else {
        const double round = 2.0 * (k / 16.0 + 8) * u * mag + 1e-30;
        ASSERT_LE(std::fabs(got - ref_x), round)
            << DTypeName(w.view.dtype) << " r " << r << " t " << t << " k "
            << k;
      }
    }
  }
}

std::vector<float> RunMatMul(const TestWeight& w, const float* x,
                             int64_t tokens, ThreadPool* pool, CpuIsa isa) {
  std::vector<float> y(tokens * w.view.shape[0], -1.0f);
  MatMulOptions options;
  options.isa = isa;
  const absl::Status s = MatMul(w.view, x, tokens, y.data(), pool, options);
  EXPECT_TRUE(s.ok()) << s;
  return y;
}

bool BitEqual(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(MatMulTest, MatchesReferenceOnOddShapesAndEveryPathIsBitIdentical) {
  auto pool = MakePool(2);
  uint32_t seed = 1;
  for (DType dtype : kDTypes) {
    for (int64_t k : {32, 96, 576, 1536}) {
      for (int64_t rows : {1, 7, 19, 989}) {
        for (int64_t tokens : {1, 3, 17, 33}) {
          SCOPED_TRACE(testing::Message()
                       << DTypeName(dtype) << " rows " << rows << " k " << k
                       << " tokens " << tokens);
          const TestWeight w = MakeWeight(dtype, rows, k, ++seed);
          const std::vector<float> x = MakeInput(tokens, k, ++seed);
          const std::vector<float> ref =
              RunMatMul(w, x.data(), tokens, nullptr, CpuIsa::kScalar);
          CheckAgainstReference(w, x, tokens, ref);
          for (CpuIsa isa : SupportedIsas()) {
            const std::vector<float> y =
                RunMatMul(w, x.data(), tokens, pool.get(), isa);
            ASSERT_TRUE(BitEqual(y.data(), ref.data(), y.size()))
                << CpuIsaName(isa) << " differs from scalar";
          }
        }
      }
    }
  }
}

// The extremes of the 8-bit dot products: Q8_0 weights of -128 and 127
// against activations quantized to +-127, where a 16-bit pair sum would
// overflow if a path summed pairs naively (AVX-512 without VNNI sums byte
// pairs in 16 bits). Every path must give the exact sums.
TEST(MatMulTest, ExtremeQ8ProductsAreExactOnEveryPath) {
  constexpr int64_t kRows = 4, kK = 64;
  const DTypeInfo& info = GetDTypeInfo(DType::kQ8_0);
  std::vector<uint8_t> bytes(kRows * kK / 32 * info.block_bytes);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kK / 32; ++b) {
      uint8_t* blk = bytes.data() + (r * kK / 32 + b) * info.block_bytes;
      PutF16(blk, 1.0f);
      for (int i = 0; i < 32; ++i) {
        const int8_t q = r % 2 == 0 ? int8_t{-128} : int8_t{127};
        std::memcpy(blk + 2 + i, &q, 1);
      }
    }
  }
  TensorView view;
  view.dtype = DType::kQ8_0;
  view.shape = {kRows, kK};
  view.data = bytes.data();
  view.nbytes = bytes.size();
  // Tokens: all +1, all -1, alternating: quantized to +-127.
  std::vector<float> x(3 * kK);
  for (int64_t i = 0; i < kK; ++i) {
    x[i] = 1.0f;
    x[kK + i] = -1.0f;
    x[2 * kK + i] = i % 2 == 0 ? 1.0f : -1.0f;
  }
  // The activations' scale is stored as an IEEE half (quantize_activations).
  const double da = F16ToF32(F32ToF16(1.0f / 127.0f));
  std::vector<float> scalar;
  for (CpuIsa isa : SupportedIsas()) {
    std::vector<float> y(3 * kRows, NAN);
    MatMulOptions options;
    options.isa = isa;
    ASSERT_TRUE(MatMul(view, x.data(), 3, y.data(), nullptr, options).ok());
    for (int64_t r = 0; r < kRows; ++r) {
      const double w = r % 2 == 0 ? -128.0 : 127.0;
      const double full = w * 127.0 * da * kK;
      EXPECT_NEAR(y[0 * kRows + r], full, 1e-6 * std::fabs(full))
          << CpuIsaName(isa) << " row " << r;
      EXPECT_NEAR(y[1 * kRows + r], -full, 1e-6 * std::fabs(full))
          << CpuIsaName(isa) << " row " << r;
      EXPECT_EQ(y[2 * kRows + r], 0.0f) << CpuIsaName(isa) << " row " << r;
    }
    if (isa == CpuIsa::kScalar) scalar = y;
    EXPECT_TRUE(BitEqual(y.data(), scalar.data(), y.size()))
        << CpuIsaName(isa) << " differs from scalar";
  }
}

TEST(MatMulTest, BatchInvariantAcrossBatchSizePositionThreadsAndPaths) {
  const int64_t rows = 203, k = 576, tokens = 37;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int n : {1, 2, 3}) pools.push_back(MakePool(n));
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const TestWeight w = MakeWeight(dtype, rows, k, 100);
    const std::vector<float> x = MakeInput(tokens, k, 101);
    // Each token alone, single-threaded, is the reference.
    std::vector<float> alone(tokens * rows);
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> y =
          RunMatMul(w, x.data() + t * k, 1, nullptr, BestCpuIsa());
      std::copy(y.begin(), y.end(), alone.begin() + t * rows);
    }
    for (CpuIsa isa : SupportedIsas()) {
      for (const auto& pool : pools) {
        // Sub-batches of every size 1..tokens at several offsets.
        for (int64_t len = 1; len <= tokens; len += (len < 8 ? 1 : 7)) {
          for (int64_t start : {int64_t{0}, (tokens - len) / 2, tokens - len}) {
            const std::vector<float> y =
                RunMatMul(w, x.data() + start * k, len, pool.get(), isa);
            ASSERT_TRUE(
                BitEqual(y.data(), alone.data() + start * rows, len * rows))
                << CpuIsaName(isa) << " threads " << pool->num_threads()
                << " batch [" << start << ", " << start + len << ")";
          }
        }
      }
    }
  }
}

TEST(MatMulTest, SharedInputIsQuantizedOnceAndGivesTheSameResults) {
  auto pool = MakePool(2);
  const int64_t k = 576, tokens = 5;
  const TestWeight q = MakeWeight(DType::kQ4_1, 64, k, 7);
  const TestWeight v = MakeWeight(DType::kQ8_0, 19, k, 8);
  const TestWeight f = MakeWeight(DType::kF32, 3, k, 9);
  const std::vector<float> x = MakeInput(tokens, k, 10);
  MatMulInput input(x.data(), tokens, k);
  for (const TestWeight* w : {&q, &v, &f}) {
    std::vector<float> y(tokens * w->view.shape[0]);
    ASSERT_TRUE(MatMul(w->view, input, y.data(), pool.get()).ok());
    const std::vector<float> separate =
        RunMatMul(*w, x.data(), tokens, nullptr, BestCpuIsa());
    EXPECT_TRUE(BitEqual(y.data(), separate.data(), y.size()));
  }
  absl::StatusOr<const Q8Activations*> q8 =
      input.Quantized(nullptr, CpuIsa::kScalar);
  ASSERT_TRUE(q8.ok());
  EXPECT_EQ((*q8)->tokens(), tokens);
}

TEST(MatMulTest, ZeroTokensOrRowsIsANoOp) {
  const TestWeight w = MakeWeight(DType::kQ4_1, 4, 64, 1);
  EXPECT_TRUE(MatMul(w.view, nullptr, 0, nullptr, nullptr).ok());
  TestWeight empty = MakeWeight(DType::kQ8_0, 0, 64, 1);
  std::vector<float> x(64);
  EXPECT_TRUE(MatMul(empty.view, x.data(), 1, nullptr, nullptr).ok());
}

TEST(MatMulTest, RejectsBadInput) {
  std::vector<float> x(4 * 96), y(64);
  {
    TestWeight w = MakeWeight(DType::kQ8_0, 4, 64, 1);
    w.view.dtype = DType::kQ6_K;
    const absl::Status s = MatMul(w.view, x.data(), 1, y.data(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(s.message(), HasSubstr("Q6_K"));
  }
  {
    TestWeight w = MakeWeight(DType::kF32, 2, 32, 1);
    w.view.shape = {4, 16};  // same bytes, k not a multiple of 32
    const absl::Status s = MatMul(w.view, x.data(), 1, y.data(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("multiple of 32"));
  }
  const TestWeight good = MakeWeight(DType::kQ4_1, 4, 64, 1);
  {
    MatMulInput input(x.data(), 1, 96);
    const absl::Status s = MatMul(good.view, input, y.data(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("k = 96"));
  }
  {
    TestWeight w = good;
    w.view.nbytes -= 1;
    EXPECT_EQ(MatMul(w.view, x.data(), 1, y.data(), nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    w.view.data = nullptr;
    EXPECT_EQ(MatMul(w.view, x.data(), 1, y.data(), nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    TestWeight w = good;
    w.view.shape = {2, 2, 64};
    EXPECT_EQ(MatMul(w.view, x.data(), 1, y.data(), nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(MatMul(good.view, x.data(), -1, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMul(good.view, x.data(), 1, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMul(good.view, nullptr, 1, y.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuFeaturesTest, NamesRoundTripAndScalarIsAlwaysSupported) {
  EXPECT_TRUE(IsCpuIsaSupported(CpuIsa::kScalar));
  EXPECT_TRUE(IsCpuIsaSupported(BestCpuIsa()));
  for (CpuIsa isa : kAllCpuIsas) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(ParseCpuIsa("sse9").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
