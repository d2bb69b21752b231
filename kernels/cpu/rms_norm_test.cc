#include "kernels/cpu/rms_norm.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/swiglu.h"

namespace baton {
namespace {

TEST(RmsNormTest, MatchesDefinition) {
  std::vector<float> x = {1, -2, 3, -4, 0.5f, 0.25f, 8, 1};
  std::vector<float> w = {1, 2, 0.5f, 1};
  std::vector<float> y(8);
  RmsNorm(x.data(), w.data(), 2, 4, 1e-5f, y.data());
  for (int t = 0; t < 2; ++t) {
    double ms = 0;
    for (int i = 0; i < 4; ++i) ms += double(x[t * 4 + i]) * x[t * 4 + i] / 4;
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(y[t * 4 + i], x[t * 4 + i] / std::sqrt(ms + 1e-5) * w[i],
                  1e-6);
    }
  }
}

TEST(RmsNormTest, RowsAreIndependentOfBatch) {
  std::vector<float> x(5 * 576), w(576, 1.1f), all(5 * 576), one(576);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  RmsNorm(x.data(), w.data(), 5, 576, 1e-5f, all.data());
  RmsNorm(x.data() + 3 * 576, w.data(), 1, 576, 1e-5f, one.data());
  for (int i = 0; i < 576; ++i) EXPECT_EQ(one[i], all[3 * 576 + i]);
}

TEST(SwiGluTest, MatchesDefinition) {
  std::vector<float> g = {-3, -0.5f, 0, 0.5f, 3}, u = {1, 2, 3, 4, 5}, out(5);
  SwiGlu(g.data(), u.data(), 5, out.data());
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6);
  }
}

}  // namespace
}  // namespace baton
