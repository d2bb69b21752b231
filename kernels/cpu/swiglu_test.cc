#include "kernels/cpu/swiglu.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

std::vector<float> Gates(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  // The edges: where e^-g under- or overflows, zero, tiny, huge.
  const float edges[] = {-87.5f, -87.0f,  -86.9f,  87.0f, 88.0f,
                         88.5f,  100.0f,  -100.0f, 0.0f,  -0.0f,
                         1e-30f, -1e-30f, 1e30f,   -1e30f};
  for (size_t i = 0; i < std::size(edges) && i < g.size(); ++i) {
    g[i] = edges[i];
  }
  return g;
}

// Against double precision, within a few ulp of the result; for gates below
// -87, where silu is below 1e-35 and e^-g is held at e^88, within 1e-35.
TEST(SwiGluTest, MatchesDoubleOnEveryPath) {
  const int64_t n = 1000;
  const std::vector<float> gate = Gates(n, 3);
  std::vector<float> up(n);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : up) x = normal(rng);
  for (CpuIsa isa : kAllCpuIsas) {
    if (!IsCpuIsaSupported(isa)) continue;
    std::vector<float> out(n, NAN);
    SwiGlu(gate.data(), up.data(), n, out.data(), isa);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i];
      const double want = g / (1.0 + std::exp(-g)) * up[i];
      ASSERT_NEAR(out[i], want, 4e-7 * std::fabs(want) + 1e-35)
          << CpuIsaName(isa) << " gate " << gate[i] << " up " << up[i];
    }
  }
}

// Every path gives the scalar path's bits, tails (n not a multiple of the
// vector width) and aliasing (out = gate) included.
TEST(SwiGluTest, BitIdenticalAcrossIsaPaths) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{1536}}) {
    const std::vector<float> gate = Gates(n, 5 + static_cast<uint32_t>(n));
    const std::vector<float> up = Gates(n, 6 + static_cast<uint32_t>(n));
    std::vector<float> scalar(n);
    SwiGlu(gate.data(), up.data(), n, scalar.data(), CpuIsa::kScalar);
    for (CpuIsa isa : kAllCpuIsas) {
      if (!IsCpuIsaSupported(isa)) continue;
      std::vector<float> out = gate;  // in place
      SwiGlu(out.data(), up.data(), n, out.data(), isa);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]),
                  std::bit_cast<uint32_t>(scalar[i]))
            << CpuIsaName(isa) << " n " << n << " element " << i << " gate "
            << gate[i];
      }
    }
  }
}

}  // namespace
}  // namespace baton
