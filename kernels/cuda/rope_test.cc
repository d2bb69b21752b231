// Device RoPE against baton::RopeTable::Apply, token by token.
#include "kernels/cuda/rope.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_test_util.h"

namespace baton::cuda {
namespace {

using ::baton::cuda_test::DeviceBuffer;
using ::baton::cuda_test::ExpectAllClose;
using ::baton::cuda_test::MaxError;

struct RopeCase {
  const char* name;
  int64_t head_dim;
  int64_t rope_dim;
  bool interleaved;
  int64_t max_positions;
  double linear_factor;
  bool llama3;  // freq_factors from Llama3FreqFactors
  int64_t tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
};

RopeOptions OptionsFor(const RopeCase& c) {
  RopeOptions o;
  o.head_dim = c.head_dim;
  o.rope_dim = c.rope_dim;
  o.theta = c.llama3 ? 500000.0 : 10000.0;
  o.interleaved = c.interleaved;
  o.max_positions = c.max_positions;
  o.linear_factor = c.linear_factor;
  if (c.llama3) {
    o.freq_factors = Llama3FreqFactors(c.rope_dim, o.theta, 8.0, 1.0, 4.0, 64);
  }
  return o;
}

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

// Runs one case; positions are random in [0, max_positions) except that
// `bad_token` (if >= 0) gets position max_positions.
void RunCase(const RopeCase& c, int64_t bad_token, uint32_t seed) {
  std::mt19937 rng(seed);
  const RopeOptions options = OptionsFor(c);
  absl::StatusOr<std::unique_ptr<RopeTable>> cpu = RopeTable::Create(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t elements = RopeTableElements(options);
  ASSERT_EQ(elements, c.max_positions * (c.rope_dim / 2));

  std::uniform_int_distribution<int32_t> pick(
      0, static_cast<int32_t>(c.max_positions - 1));
  std::vector<int32_t> positions(c.tokens);
  for (int32_t& p : positions) p = pick(rng);
  positions[0] = static_cast<int32_t>(c.max_positions - 1);
  if (bad_token >= 0)
    positions[bad_token] = static_cast<int32_t>(c.max_positions);
  const int64_t q_size = c.tokens * c.num_heads * c.head_dim;
  const int64_t k_size = c.tokens * c.num_kv_heads * c.head_dim;
  const std::vector<float> q = Random(q_size, rng);
  const std::vector<float> k = Random(k_size, rng);
  std::vector<float> q_ref = q, k_ref = k;
  // The rotated elements of every head of token t in x become NaN.
  const auto poison_token = [&](float* x, int64_t heads) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
        const int64_t a = c.interleaved ? 2 * i : i;
        const int64_t b = c.interleaved ? 2 * i + 1 : i + c.rope_dim / 2;
        x[h * c.head_dim + a] = NAN;
        x[h * c.head_dim + b] = NAN;
      }
    }
  };
  for (int64_t t = 0; t < c.tokens; ++t) {
    float* qt = q_ref.data() + t * c.num_heads * c.head_dim;
    float* kt = k_ref.data() + t * c.num_kv_heads * c.head_dim;
    if (t == bad_token) {
      poison_token(qt, c.num_heads);
      poison_token(kt, c.num_kv_heads);
      continue;
    }
    (*cpu)->Apply(qt, c.num_heads, positions[t]);
    if (c.num_kv_heads > 0) (*cpu)->Apply(kt, c.num_kv_heads, positions[t]);
  }

  DeviceBuffer<float> d_cos(elements), d_sin(elements);
  DeviceBuffer<int32_t> d_pos{std::span<const int32_t>(positions)};
  DeviceBuffer<float> d_q{std::span<const float>(q)};
  DeviceBuffer<float> d_k{std::span<const float>(k)};
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  RopeDeviceTable table;
  BATON_ASSERT_CUDA_OK(
      UploadRopeTable(options, d_cos.get(), d_sin.get(), &table, nullptr));
  BATON_ASSERT_CUDA_OK(ApplyRope(
      table, d_pos.get(), c.tokens, d_q.get(), c.num_heads,
      c.num_kv_heads > 0 ? d_k.get() : nullptr, c.num_kv_heads, nullptr));
  // Same table and the same float operations without fused multiply-add:
  // exact (atol 0, rtol 0). NaN where the reference is NaN.
  const auto check = [&](const std::vector<float>& got,
                         const std::vector<float>& ref, const char* tag) {
    std::vector<float> g, r;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (std::isnan(ref[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << c.name << " " << tag << " " << i;
      } else {
        g.push_back(got[i]);
        r.push_back(ref[i]);
      }
    }
    const std::string what = std::string(c.name) + "_" + tag;
    const MaxError err = ExpectAllClose(g, r, 0.0, 0.0, what);
    std::printf("BATON_KERNEL_ERROR op=rope case=%s max_abs=%g atol=0 rtol=0\n",
                what.c_str(), err.abs);
  };
  check(d_q.Download(), q_ref, "q");
  check(d_k.Download(), k_ref, "k");
}

const RopeCase kCases[] = {
    // name, head_dim, rope_dim, interleaved, max_pos, linear, llama3,
    // tokens, heads, kv_heads
    {"smollm_halves", 64, 64, false, 989, 1.0, false, 19, 9, 3},
    {"smollm_pairs", 64, 64, true, 989, 1.0, false, 7, 9, 3},
    {"one", 2, 2, true, 1, 1.0, false, 1, 1, 1},
    {"hd7_partial", 7, 6, false, 19, 1.0, false, 7, 3, 1},
    {"hd19_partial_pairs", 19, 8, true, 50, 2.0, false, 19, 5, 2},
    {"llama3_hd128", 128, 128, false, 4096, 1.0, true, 33, 8, 2},
    {"q_only", 64, 32, false, 100, 1.0, false, 5, 4, 0},
    // tokens * heads * pairs > 256 * 65536: the grid-stride loop.
    {"grid_stride", 64, 64, false, 989, 1.0, false, 45000, 9, 3},
};

TEST(CudaRopeTest, MatchesCpuRopeTable) {
  BATON_SKIP_WITHOUT_CUDA();
  uint32_t seed = 3;
  for (const RopeCase& c : kCases) {
    RunCase(c, /*bad_token=*/-1, seed++);
    ASSERT_FALSE(HasFatalFailure()) << c.name;
  }
}

TEST(CudaRopeTest, OutOfRangePositionGivesNaN) {
  BATON_SKIP_WITHOUT_CUDA();
  RunCase(kCases[3], /*bad_token=*/2, 99);
}

TEST(CudaRopeArgsTest, RejectsBadArgumentsWithoutLaunching) {
  RopeOptions bad;
  bad.head_dim = 8;
  bad.rope_dim = 7;
  bad.max_positions = 4;
  EXPECT_EQ(RopeTableElements(bad), 0);
  RopeDeviceTable out;
  float* fake = reinterpret_cast<float*>(16);
  EXPECT_EQ(UploadRopeTable(bad, fake, fake, &out, nullptr),
            cudaErrorInvalidValue);
  RopeOptions good = bad;
  good.rope_dim = 8;
  EXPECT_EQ(RopeTableElements(good), 16);
  EXPECT_EQ(UploadRopeTable(good, nullptr, fake, &out, nullptr),
            cudaErrorInvalidValue);

  // The same options are rejected as by RopeTable::Create.
  std::vector<RopeOptions> variants(7, good);
  variants[1].theta = 0;
  variants[2].linear_factor = -1;
  variants[3].freq_factors = {1.0, 2.0};
  variants[4].freq_factors = {1.0, 2.0, 3.0, 4.0};
  variants[5].max_positions = 0;
  variants[6].rope_dim = 10;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_EQ(RopeTableElements(variants[i]) > 0,
              RopeTable::Create(variants[i]).ok())
        << "variant " << i;
  }

  RopeDeviceTable table{fake, fake, 8, 8, true, 4};
  const int32_t* pos = reinterpret_cast<const int32_t*>(16);
  EXPECT_EQ(ApplyRope(table, pos, -1, fake, 1, fake, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(table, pos, 1, nullptr, 1, fake, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(table, pos, 1, fake, 1, nullptr, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(table, nullptr, 1, fake, 1, fake, 1, nullptr),
            cudaErrorInvalidValue);
  RopeDeviceTable odd = table;
  odd.rope_dim = 5;
  EXPECT_EQ(ApplyRope(odd, pos, 1, fake, 1, fake, 1, nullptr),
            cudaErrorInvalidValue);
  RopeDeviceTable wide = table;
  wide.rope_dim = 10;
  EXPECT_EQ(ApplyRope(wide, pos, 1, fake, 1, fake, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(table, nullptr, 0, nullptr, 1, nullptr, 1, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace baton::cuda
