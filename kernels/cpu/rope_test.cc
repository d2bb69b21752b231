#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

RopeOptions Options(int64_t head_dim, int64_t rope_dim, double theta,
                    bool interleaved, int64_t max_positions) {
  RopeOptions o;
  o.head_dim = head_dim;
  o.rope_dim = rope_dim;
  o.theta = theta;
  o.interleaved = interleaved;
  o.max_positions = max_positions;
  return o;
}

TEST(RopeTest, InterleavedRotatesAdjacentPairs) {
  auto table = RopeTable::Create(Options(4, 4, 10000.0, true, 8));
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<float> x = {1, 0, 1, 0};
  (*table)->Apply(x.data(), 1, 3);
  // pair 0: angle 3 * 1; pair 1: angle 3 * 10000^(-1/2) = 0.03
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(3.0), 1e-6);
  EXPECT_NEAR(x[2], std::cos(0.03), 1e-6);
  EXPECT_NEAR(x[3], std::sin(0.03), 1e-6);
}

TEST(RopeTest, HalfSplitRotatesHalves) {
  auto table = RopeTable::Create(Options(4, 4, 10000.0, false, 8));
  ASSERT_TRUE(table.ok());
  std::vector<float> x = {1, 1, 0, 0};
  (*table)->Apply(x.data(), 1, 2);
  EXPECT_NEAR(x[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(2.0), 1e-6);
  EXPECT_NEAR(x[1], std::cos(0.02), 1e-6);
  EXPECT_NEAR(x[3], std::sin(0.02), 1e-6);
}

// The two conventions are the same rotation on permuted dimensions, which is
// how GGUF converters turn HF Q/K weights into interleaved ones.
TEST(RopeTest, ConventionsAgreeUnderPermutation) {
  const int64_t d = 64;
  auto inter = RopeTable::Create(Options(d, d, 1e5, true, 100));
  auto half = RopeTable::Create(Options(d, d, 1e5, false, 100));
  ASSERT_TRUE(inter.ok() && half.ok());
  std::vector<float> a(d), b(d);
  for (int64_t i = 0; i < d; ++i) a[i] = std::sin(0.37f * i) + 0.1f * i;
  for (int64_t i = 0; i < d / 2; ++i) {
    b[i] = a[2 * i];
    b[i + d / 2] = a[2 * i + 1];
  }
  (*inter)->Apply(a.data(), 1, 77);
  (*half)->Apply(b.data(), 1, 77);
  for (int64_t i = 0; i < d / 2; ++i) {
    EXPECT_EQ(a[2 * i], b[i]);
    EXPECT_EQ(a[2 * i + 1], b[i + d / 2]);
  }
}

TEST(RopeTest, PartialRotationLeavesTailAlone) {
  auto table = RopeTable::Create(Options(8, 4, 100.0, true, 4));
  ASSERT_TRUE(table.ok());
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  (*table)->Apply(x.data(), 1, 3);
  EXPECT_EQ(x[4], 5);
  EXPECT_EQ(x[7], 8);
}

TEST(RopeTest, RejectsBadOptions) {
  EXPECT_FALSE(RopeTable::Create(Options(8, 5, 10000.0, true, 4)).ok());
  EXPECT_FALSE(RopeTable::Create(Options(8, 10, 10000.0, true, 4)).ok());
  EXPECT_FALSE(RopeTable::Create(Options(8, 8, 10000.0, true, 0)).ok());
  RopeOptions bad_factors = Options(8, 8, 10000.0, true, 4);
  bad_factors.freq_factors = {1.0};
  EXPECT_FALSE(RopeTable::Create(bad_factors).ok());
}

TEST(RopeTest, Llama3FactorsAreOneForHighFrequenciesAndFactorForLow) {
  std::vector<double> f = Llama3FreqFactors(64, 500000.0, 32.0, 1.0, 4.0, 8192);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[31], 32.0);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
}

}  // namespace
}  // namespace baton
