#include "kernels/cuda/sampling.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/softmax.h"
#include "worker/sampler/sampler.h"
#include "worker/sampler/sampling_params.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;
using ::baton::cuda_test::ExpectAllClose;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kVocabs[] = {1, 7, 989, 49152};

// batch rows of seeded logits: normal with a per-row scale (1 to 7); about
// 3% -inf entries (never the whole row); every third row rounded to
// multiples of 0.25 so that many logits tie.
std::vector<float> RandomLogits(int32_t batch, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(batch) * vocab);
  for (int32_t b = 0; b < batch; ++b) {
    const float scale = 1.0f + 2.0f * static_cast<float>(b % 4);
    const bool ties = b % 3 == 0;
    for (int32_t v = 0; v < vocab; ++v) {
      float z = normal(rng) * scale;
      if (ties) z = std::round(z * 4.0f) / 4.0f;
      if (v > 0 && unit(rng) < 0.03f) z = kNegInf;
      logits[static_cast<size_t>(b) * vocab + v] = z;
    }
  }
  return logits;
}

// Ties to the lowest id; NaN ignored; -1 if only NaN.
int32_t ReferenceArgmax(const float* row, int32_t vocab) {
  int32_t best = -1;
  for (int32_t v = 0; v < vocab; ++v) {
    if (std::isnan(row[v])) continue;
    if (best < 0 || row[v] > row[best]) best = v;
  }
  return best;
}

TEST(CudaSamplingUniformTest, MatchesTheCpuSamplerStream) {
  // With equal logits every token has weight 1 and the order is by id, so
  // the CPU sampler draws token floor(u * vocab): this pins 16 bits of
  // every uniform the CPU sampler uses.
  constexpr int32_t kVocab = 1 << 16;
  const std::vector<float> logits(kVocab, 0.5f);
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xDEADBEEFCAFEull, ~0ull}) {
    SamplingParams params;
    params.seed = seed;
    absl::StatusOr<std::unique_ptr<RequestSampler>> sampler =
        RequestSampler::Create(params, {});
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    for (uint64_t n = 0; n < 20; ++n) {
      const double u = SamplerUniform(seed, n);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      absl::StatusOr<SampleResult> result = (*sampler)->Sample(logits);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->token, static_cast<int32_t>(u * kVocab))
          << "seed " << seed << " draw " << n;
      (*sampler)->Accept(result->token);
    }
  }
}

TEST(CudaSamplingValidationTest, BadArgumentsFailWithoutLaunching) {
  const float* logits = reinterpret_cast<const float*>(16);
  int32_t* tokens = reinterpret_cast<int32_t*>(16);
  float* out = reinterpret_cast<float*>(16);
  const SampleRowParams* params = reinterpret_cast<const SampleRowParams*>(16);
  EXPECT_EQ(ArgmaxRows(logits, tokens, -1, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ArgmaxRows(logits, tokens, 2, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ArgmaxRows(nullptr, tokens, 2, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ArgmaxRows(nullptr, nullptr, 0, 0, nullptr), cudaSuccess);
  EXPECT_EQ(SampleRows(logits, params, tokens, -1, 8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SampleRows(logits, nullptr, tokens, 2, 8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SampleRows(logits, params, tokens, 2, 1 << 23, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SampleRows(nullptr, nullptr, nullptr, 0, 0, nullptr), cudaSuccess);
  EXPECT_EQ(SoftmaxRows(logits, out, -1, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(SoftmaxRows(logits, nullptr, 2, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LogSoftmaxRows(logits, out, 2, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LogSoftmaxRows(nullptr, nullptr, 0, 0, nullptr), cudaSuccess);
}

TEST(CudaSamplingTest, ArgmaxMatchesReference) {
  BATON_SKIP_WITHOUT_CUDA();
  constexpr int32_t kBatch = 37;
  for (int32_t vocab : kVocabs) {
    std::vector<float> logits = RandomLogits(kBatch, vocab, 7 + vocab);
    // Row 1: the maximum twice (ties to the lower id); row 2: NaN entries;
    // row 3: only -inf past id 0.
    float* r1 = &logits[static_cast<size_t>(vocab)];
    r1[vocab - 1] = 1e9f;
    r1[vocab / 2] = 1e9f;
    float* r2 = &logits[2 * static_cast<size_t>(vocab)];
    r2[0] = std::numeric_limits<float>::quiet_NaN();
    r2[vocab - 1] = 5e8f;
    float* r3 = &logits[3 * static_cast<size_t>(vocab)];
    std::fill(r3, r3 + vocab, kNegInf);
    DeviceBuffer<float> d_logits{std::span<const float>(logits)};
    DeviceBuffer<int32_t> d_tokens(kBatch);
    d_tokens.Poison();
    ASSERT_FALSE(HasFatalFailure());
    BATON_ASSERT_CUDA_OK(
        ArgmaxRows(d_logits.get(), d_tokens.get(), kBatch, vocab, nullptr));
    const std::vector<int32_t> got = d_tokens.Download();
    int mismatches = 0;
    for (int32_t b = 0; b < kBatch; ++b) {
      const int32_t want =
          ReferenceArgmax(&logits[static_cast<size_t>(b) * vocab], vocab);
      EXPECT_EQ(got[b], want) << "vocab " << vocab << " row " << b;
      mismatches += got[b] != want;
    }
    std::printf(
        "BATON_KERNEL_ERROR op=argmax case=v%d max_abs=%g atol=0 rtol=0\n",
        vocab, static_cast<double>(mismatches) / kBatch);
  }
}

// Reference in double. Tolerances (|got - ref| <= atol + |ref| * rtol):
//   log-softmax: atol 2e-5 covers the float32 sum of exp(z - m) (<= ~200
//     sequential adds per thread plus an 8-level tree at vocab 49152, each
//     adding <= 2^-24 relative, so log(s) is off by <= ~1.2e-5), rtol 2^-22
//     covers rounding z - m.
//   softmax: relative error of expf (2 ulp), of z - m, of the sum and of
//     the reciprocal, <= ~2e-5 together; atol 1e-9 for tiny probabilities.
TEST(CudaSamplingTest, SoftmaxAndLogSoftmaxMatchReference) {
  BATON_SKIP_WITHOUT_CUDA();
  constexpr int32_t kBatch = 5;
  for (int32_t vocab : kVocabs) {
    const std::vector<float> logits = RandomLogits(kBatch, vocab, 11 + vocab);
    std::vector<float> ref_log(logits.size());
    std::vector<float> ref_prob(logits.size());
    for (int32_t b = 0; b < kBatch; ++b) {
      const float* z = &logits[static_cast<size_t>(b) * vocab];
      double m = -std::numeric_limits<double>::infinity();
      for (int32_t v = 0; v < vocab; ++v) m = std::max(m, double{z[v]});
      double s = 0.0;
      for (int32_t v = 0; v < vocab; ++v) s += std::exp(z[v] - m);
      for (int32_t v = 0; v < vocab; ++v) {
        const size_t i = static_cast<size_t>(b) * vocab + v;
        ref_log[i] = static_cast<float>(z[v] - m - std::log(s));
        ref_prob[i] = static_cast<float>(std::exp(z[v] - m) / s);
      }
    }
    DeviceBuffer<float> d_logits{std::span<const float>(logits)};
    DeviceBuffer<float> d_out(logits.size());
    for (bool log : {true, false}) {
      d_out.Poison();
      ASSERT_FALSE(HasFatalFailure());
      BATON_ASSERT_CUDA_OK(log ? LogSoftmaxRows(d_logits.get(), d_out.get(),
                                                kBatch, vocab, nullptr)
                               : SoftmaxRows(d_logits.get(), d_out.get(),
                                             kBatch, vocab, nullptr));
      std::vector<float> got = d_out.Download();
      const std::vector<float>& ref = log ? ref_log : ref_prob;
      // -inf log-probabilities must match exactly; compare the rest.
      std::vector<float> got_f, ref_f;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isinf(ref[i])) {
          EXPECT_EQ(got[i], ref[i]) << "element " << i;
          continue;
        }
        got_f.push_back(got[i]);
        ref_f.push_back(ref[i]);
      }
      const double atol = log ? 2e-5 : 1e-9;
      const double rtol = log ? 0x1p-22 : 2e-5;
      const std::string op = log ? "log_softmax" : "softmax";
      const cuda_test::MaxError err = ExpectAllClose(
          got_f, ref_f, atol, rtol, op + " v" + std::to_string(vocab));
      std::printf(
          "BATON_KERNEL_ERROR op=%s case=v%d max_abs=%g atol=%g "
          "rtol=%g\n",
          op.c_str(), vocab, err.abs, atol, rtol);
    }
  }
}

struct ParamCase {
  const char* name;
  double temperature;
  int32_t top_k;
  double top_p;
  double min_p;
};

constexpr ParamCase kParamCases[] = {
    {"greedy", 0.0, 0, 1.0, 0.0},
    {"t1", 1.0, 0, 1.0, 0.0},
    {"t0.7_topk50", 0.7, 50, 1.0, 0.0},
    {"topp0.9", 1.0, 0, 0.9, 0.0},
    {"minp0.05", 1.0, 0, 1.0, 0.05},
    {"combined", 0.8, 100, 0.92, 0.02},
    {"t1.3_topk3000_topp0.99", 1.3, 3000, 0.99, 0.0},
};

uint64_t RowSeed(int32_t vocab, int c, int32_t row) {
  return static_cast<uint64_t>(
      SamplerUniform(0x5EEDull + static_cast<uint64_t>(vocab) * 131 + c,
                     static_cast<uint64_t>(row)) *
      0x1p53);
}

// The GPU draw against RequestSampler fed the same logits and seed (its
// uniform is SamplerUniform(seed, 0)). Tokens must be identical except where
// uniform * mass falls within float rounding of a candidate boundary; those
// rows are counted and must stay below 0.5% per case (greedy: none).
TEST(CudaSamplingTest, SampleMatchesCpuSampler) {
  BATON_SKIP_WITHOUT_CUDA();
  for (int32_t vocab : kVocabs) {
    const int32_t batch = vocab >= 49152 ? 96 : 400;
    for (int c = 0; c < static_cast<int>(std::size(kParamCases)); ++c) {
      const ParamCase& pc = kParamCases[c];
      SCOPED_TRACE(std::string(pc.name) + " vocab " + std::to_string(vocab));
      const std::vector<float> logits =
          RandomLogits(batch, vocab, 1000 + vocab * 17 + c);
      std::vector<SampleRowParams> row_params(batch);
      std::vector<int32_t> want(batch);
      for (int32_t b = 0; b < batch; ++b) {
        SamplingParams sp;
        sp.temperature = pc.temperature;
        sp.top_k = pc.top_k;
        sp.top_p = pc.top_p;
        sp.min_p = pc.min_p;
        sp.seed = RowSeed(vocab, c, b);
        absl::StatusOr<std::unique_ptr<RequestSampler>> sampler =
            RequestSampler::Create(sp, {});
        ASSERT_TRUE(sampler.ok()) << sampler.status();
        absl::StatusOr<SampleResult> result = (*sampler)->Sample(
            std::span<const float>(&logits[static_cast<size_t>(b) * vocab],
                                   static_cast<size_t>(vocab)));
        ASSERT_TRUE(result.ok()) << result.status();
        want[b] = result->token;
        SampleRowParams& p = row_params[b];
        p.temperature = pc.temperature;
        p.top_k = pc.top_k;
        p.top_p = pc.top_p;
        p.min_p = pc.min_p;
        p.uniform = SamplerUniform(*sp.seed, 0);
      }
      DeviceBuffer<float> d_logits{std::span<const float>(logits)};
      DeviceBuffer<SampleRowParams> d_params{
          std::span<const SampleRowParams>(row_params)};
      DeviceBuffer<int32_t> d_tokens(batch);
      d_tokens.Poison();
      ASSERT_FALSE(HasFatalFailure());
      BATON_ASSERT_CUDA_OK(SampleRows(d_logits.get(), d_params.get(),
                                      d_tokens.get(), batch, vocab, nullptr));
      const std::vector<int32_t> got = d_tokens.Download();
      int mismatches = 0;
      for (int32_t b = 0; b < batch; ++b) {
        ASSERT_GE(got[b], 0) << "row " << b;
        ASSERT_LT(got[b], vocab) << "row " << b;
        EXPECT_FALSE(
            std::isinf(logits[static_cast<size_t>(b) * vocab + got[b]]))
            << "row " << b << " drew a -inf token";
        if (got[b] != want[b]) {
          ++mismatches;
          std::printf("sample mismatch %s vocab %d row %d: gpu %d cpu %d\n",
                      pc.name, vocab, b, got[b], want[b]);
        }
      }
      const double fraction = static_cast<double>(mismatches) / batch;
      if (pc.temperature == 0.0) {
        EXPECT_EQ(mismatches, 0);
      } else {
        EXPECT_LT(fraction, 0.005) << mismatches << " of " << batch;
      }
      std::printf(
          "BATON_KERNEL_ERROR op=sample case=v%d_%s max_abs=%g "
          "atol=0.005 rtol=0\n",
          vocab, pc.name, fraction);
    }
  }
}

TEST(CudaSamplingTest, RowWithoutFiniteLogitGivesMinusOne) {
  BATON_SKIP_WITHOUT_CUDA();
  constexpr int32_t kVocab = 989;
  std::vector<float> logits(2 * kVocab, kNegInf);
  logits[kVocab + 500] = 3.0f;  // Row 1: a single finite logit.
  std::vector<SampleRowParams> params(2);
  params[0].uniform = params[1].uniform = 0.999;
  DeviceBuffer<float> d_logits{std::span<const float>(logits)};
  DeviceBuffer<SampleRowParams> d_params{
      std::span<const SampleRowParams>(params)};
  DeviceBuffer<int32_t> d_tokens(2);
  d_tokens.Poison();
  ASSERT_FALSE(HasFatalFailure());
  BATON_ASSERT_CUDA_OK(SampleRows(d_logits.get(), d_params.get(),
                                  d_tokens.get(), 2, kVocab, nullptr));
  const std::vector<int32_t> got = d_tokens.Download();
  EXPECT_EQ(got[0], -1);
  EXPECT_EQ(got[1], 500);
}

}  // namespace
}  // namespace baton::cuda
