#include "kernels/cpu/quantize_activations.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/thread_pool.h"

namespace baton {
namespace {

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : kAllCpuIsas) {
    if (IsCpuIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

Quantized Quantize(const std::vector<float>& x, CpuIsa isa) {
  const int64_t k = static_cast<int64_t>(x.size());
  Quantized out{std::vector<int8_t>(k), std::vector<float>(k / 32),
                std::vector<float>(k / 32)};
  QuantizeRowQ8(x.data(), k, out.q.data(), out.d.data(), out.s.data(), isa);
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(QuantizeActivationsTest, ScalarMatchesDefinition) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(576);
  for (float& v : x) v = dist(rng);
  Quantized q = Quantize(x, CpuIsa::kScalar);
  for (int b = 0; b < 576 / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;  // codes use the unrounded scale
    EXPECT_EQ(q.d[b], F16ToF32(F32ToF16(d)));
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int8_t qi = q.q[b * 32 + i];
      EXPECT_LE(std::abs(qi), 127);
      EXPECT_LE(std::fabs(x[b * 32 + i] - d * qi), d * 0.5f * 1.0001f);
      sum += qi;
    }
    EXPECT_EQ(q.s[b], F16ToF32(F32ToF16(d * static_cast<float>(sum))));
  }
}

TEST(QuantizeActivationsTest, TiesRoundHalfToEvenOnEveryPath) {
  // amax = 127 gives d = 1 and 1/d = 1, so x * (1/d) = x exactly.
  std::vector<float> x(64, 0.0f);
  const float ties[] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, -126.5f, 3.49f};
  const int8_t want[] = {127, 2, -4, 0, 0, 2, -126, 3};
  for (int i = 0; i < 8; ++i) x[i] = ties[i];
  for (CpuIsa isa : SupportedIsas()) {
    Quantized q = Quantize(x, isa);
    EXPECT_EQ(q.d[0], 1.0f);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(q.q[i], want[i]) << CpuIsaName(isa) << " element " << i;
    }
    // The all-zero second block quantizes to d = 0, q = 0, s = 0.
    EXPECT_EQ(q.d[1], 0.0f);
    EXPECT_EQ(q.s[1], 0.0f);
    for (int i = 32; i < 64; ++i) EXPECT_EQ(q.q[i], 0);
  }
}

TEST(QuantizeActivationsTest, SimdPathsAreBitIdenticalToScalar) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t k = 32 * (1 + trial % 50);
    std::vector<float> x(k);
    // Mix scales so blocks span tiny to large values, with exact ties.
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (float& v : x) v = u(rng) * scale;
    if (trial % 3 == 0) {
      for (int64_t i = 0; i < k; i += 5) x[i] = std::round(x[i] * 4) / 4;
    }
    const Quantized ref = Quantize(x, CpuIsa::kScalar);
    for (CpuIsa isa : SupportedIsas()) {
      const Quantized got = Quantize(x, isa);
      ASSERT_EQ(got.q, ref.q) << CpuIsaName(isa) << " trial " << trial;
      ASSERT_TRUE(BitEqual(got.d, ref.d)) << CpuIsaName(isa);
      ASSERT_TRUE(BitEqual(got.s, ref.s)) << CpuIsaName(isa);
    }
  }
}

TEST(QuantizeActivationsTest, BatchedMatchesRowByRowWithThreads) {
  ThreadPoolOptions options;
  options.num_threads = 3;
  auto pool = ThreadPool::Create(options);
  ASSERT_TRUE(pool.ok());
  const int64_t tokens = 300, k = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> x(tokens * k);
  for (float& v : x) v = dist(rng);
  Q8Activations act;
  ASSERT_TRUE(QuantizeActivations(x.data(), tokens, k, &act, pool->get()).ok());
  ASSERT_EQ(act.tokens(), tokens);
  ASSERT_EQ(act.blocks_per_token(), k / 32);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> row(x.begin() + t * k, x.begin() + (t + 1) * k);
    const Quantized ref = Quantize(row, CpuIsa::kScalar);
    ASSERT_EQ(std::memcmp(act.quants(t), ref.q.data(), k), 0) << t;
    ASSERT_EQ(std::memcmp(act.scales(t), ref.d.data(), k / 32 * 4), 0) << t;
    ASSERT_EQ(std::memcmp(act.sums(t), ref.s.data(), k / 32 * 4), 0) << t;
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(act.quants(0)) % 64, 0u);
}

TEST(QuantizeActivationsTest, RejectsBadShapes) {
  Q8Activations act;
  float x[64] = {};
  EXPECT_EQ(QuantizeActivations(x, 1, 48, &act, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeActivations(x, 1, 0, &act, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeActivations(x, -1, 32, &act, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(QuantizeActivations(x, 0, 32, &act, nullptr).ok());
}

}  // namespace
}  // namespace baton
