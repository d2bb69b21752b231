#include "model/synth/weight_quantizer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

constexpr int kRowSize = 256;

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "weight_quantizer_test_",
                      ::getpid(), "_", name);
}

// Rows that probe every branch: seeded normal rows at many magnitudes, rows
// of zeros and of one repeated value, exact rounding ties, subnormals,
// spikes and signed zeros.
std::vector<float> TestRows() {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v;
  auto row = [&](auto f) {
    for (int i = 0; i < kRowSize; ++i) v.push_back(f(i));
  };
  for (float scale : {1e-30f, 1e-6f, 0.02f, 1.0f, 300.0f, 1e5f, 1e20f}) {
    for (int r = 0; r < 8; ++r) row([&](int) { return normal(rng) * scale; });
  }
  for (int r = 0; r < 4; ++r) {  // shifted away from zero: Q4_1's min matters
    row([&](int) { return 5.0f + normal(rng) * 0.1f; });
  }
  row([](int) { return 0.0f; });
  row([](int) { return 0.37f; });
  row([](int) { return -2.5f; });
  row([](int) { return 65504.0f * 4; });               // d overflows half
  row([](int i) { return (i % 64 - 31.5f) * 1.0f; });  // halves: Q8_0 ties
  row([](int i) { return (i % 32) * 0.5f; });          // Q4_1 ties at d = 1/2
  row([](int i) { return (i % 32) - 16.0f; });         // Q4_0 ties
  row([](int i) { return (i % 5 - 2) * 1e-40f; });     // subnormals
  row([&](int i) { return i % 32 == 7 ? 100.0f : normal(rng) * 0.01f; });
  row([&](int i) { return i % 32 == 9 ? -100.0f : normal(rng) * 0.01f; });
  row([&](int i) {  // |max| ties between a positive and a negative value
    return i % 32 == 3 ? 2.0f : (i % 32 == 20 ? -2.0f : normal(rng) * 0.1f);
  });
  // Signed zeros, but never +0 and -0 tied as a block's min or max: numpy's
  // SIMD min/max picks between those by lane position.
  row([](int) { return -0.0f; });
  row([](int i) { return i % 3 == 0 ? -0.0f : 1.0f; });
  row([](int i) { return i % 3 == 0 ? 0.0f : -1.0f; });
  return v;
}

// gguf.quants.quantize of the rows in argv[1], each type into argv[2].TYPE.
constexpr char kScript[] = R"PY(
import sys
import numpy as np
from gguf import quants, GGMLQuantizationType as T
np.seterr(all="ignore")  # overflow rows are part of the test
x = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, int(sys.argv[3]))
for name in ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16"]:
    quants.quantize(x, T[name]).tofile(sys.argv[2] + "." + name)
)PY";

TEST(WeightQuantizerTest, BitExactWithGgufPackage) {
  std::string python = testing::PythonPath();
  ASSERT_FALSE(python.empty())
      << "BATON_PYTHON is not set; run scripts/setup.sh";
  std::vector<float> rows = TestRows();
  std::string in = TempPath("in.f32");
  std::string out = TempPath("out");
  std::string script = TempPath("quant.py");
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(rows.data()),
            rows.size() * sizeof(float));
    std::ofstream(script) << kScript;
  }
  auto result = testing::RunCommand(
      absl::StrCat(python, " ", script, " ", in, " ", out, " ", kRowSize));
  ASSERT_TRUE(result.ok()) << result.status()
                           << " (needs the venv with numpy and gguf; run "
                              "scripts/setup.sh)";
  const int num_rows = rows.size() / kRowSize;
  for (DType dtype :
       {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kF16, DType::kBF16}) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    SCOPED_TRACE(info.name);
    std::string ref_path = absl::StrCat(out, ".", info.name);
    std::ifstream f(ref_path, std::ios::binary);
    std::vector<uint8_t> ref((std::istreambuf_iterator<char>(f)),
                             std::istreambuf_iterator<char>());
    std::remove(ref_path.c_str());
    const size_t row_bytes = kRowSize / info.block_size * info.block_bytes;
    ASSERT_EQ(ref.size(), row_bytes * num_rows);
    std::vector<uint8_t> got(ref.size());
    ASSERT_TRUE(QuantizeWeights(dtype, rows, got).ok());
    int bad_rows = 0;
    for (int r = 0; r < num_rows; ++r) {
      if (std::memcmp(got.data() + r * row_bytes, ref.data() + r * row_bytes,
                      row_bytes) != 0) {
        ++bad_rows;
        ADD_FAILURE() << "row " << r << " differs from gguf.quants.quantize";
      }
    }
    EXPECT_EQ(bad_rows, 0);
  }
  std::remove(in.c_str());
  std::remove(script.c_str());
}

TEST(WeightQuantizerTest, F32IsACopy) {
  std::vector<float> x = {1.5f, -0.0f, 3e38f};
  std::vector<uint8_t> out(12);
  ASSERT_TRUE(QuantizeWeights(DType::kF32, x, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), x.data(), 12), 0);
}

TEST(WeightQuantizerTest, RejectsBadSizesAndTypes) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> out(40);
  EXPECT_TRUE(QuantizeWeights(DType::kQ4_1, x, out).ok());
  EXPECT_EQ(QuantizeWeights(DType::kQ4_1, std::span(x.data(), 33), out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeWeights(DType::kQ4_1, x, std::span(out.data(), 39)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeWeights(DType::kQ6_K, x, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CanQuantizeWeights(DType::kQ4_K));
}

TEST(WeightQuantizerTest, NonFiniteInputDoesNotCrash) {
  std::vector<float> x(32, NAN);
  x[3] = INFINITY;
  std::vector<uint8_t> out(34);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0}) {
    std::vector<uint8_t> o(GetDTypeInfo(t).block_bytes);
    EXPECT_TRUE(QuantizeWeights(t, x, o).ok());
  }
}

}  // namespace
}  // namespace baton
