#include "kernels/cpu/dequantize.h"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "model/gguf/gguf_file.h"

namespace baton {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Hand-built blocks. Each test packs chosen quants and scales with an encoder
// written from the format description; scales are powers of two and small
// integers, so every expected value is exact whatever the rounding order.

void PutF16(std::vector<uint8_t>& b, size_t offset, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(&b[offset], &h, sizeof(h));
}

std::vector<float> Dequantize(DType dtype, const std::vector<uint8_t>& bytes,
                              int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  const absl::Status status = DequantizeRow(dtype, bytes.data(), out.data(), n);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(DequantizeTest, Q4_0HandBuiltBlock) {
  std::vector<uint8_t> b(18);
  PutF16(b, 0, 2.0f);
  for (int l = 0; l < 16; ++l)
    b[2 + l] = static_cast<uint8_t>(l | (15 - l) << 4);
  std::vector<float> expected(32);
  for (int l = 0; l < 16; ++l) {
    expected[l] = 2.0f * (l - 8);
    expected[16 + l] = 2.0f * (15 - l - 8);
  }
  EXPECT_THAT(Dequantize(DType::kQ4_0, b, 32), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q4_1HandBuiltBlock) {
  std::vector<uint8_t> b(20);
  PutF16(b, 0, 0.5f);
  PutF16(b, 2, -1.0f);
  for (int l = 0; l < 16; ++l)
    b[4 + l] = static_cast<uint8_t>(l | (15 - l) << 4);
  std::vector<float> expected(32);
  for (int l = 0; l < 16; ++l) {
    expected[l] = 0.5f * l - 1.0f;              // -1, -0.5, ..., 6.5
    expected[16 + l] = 0.5f * (15 - l) - 1.0f;  // 6.5, ..., -1
  }
  EXPECT_THAT(Dequantize(DType::kQ4_1, b, 32), ElementsAreArray(expected));
}

// Q5_0 / Q5_1 with q(i) = i: low nibbles l and l, bit 4 set for i >= 16.
std::vector<uint8_t> Q5Block(int header_bytes) {
  std::vector<uint8_t> b(header_bytes + 4 + 16);
  const uint32_t qh = 0xFFFF0000u;
  std::memcpy(&b[header_bytes], &qh, sizeof(qh));
  for (int l = 0; l < 16; ++l)
    b[header_bytes + 4 + l] = static_cast<uint8_t>(l | l << 4);
  return b;
}

TEST(DequantizeTest, Q5_0HandBuiltBlock) {
  std::vector<uint8_t> b = Q5Block(2);
  PutF16(b, 0, 1.0f);
  std::vector<float> expected(32);
  for (int i = 0; i < 32; ++i) expected[i] = static_cast<float>(i - 16);
  EXPECT_THAT(Dequantize(DType::kQ5_0, b, 32), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q5_1HandBuiltBlock) {
  std::vector<uint8_t> b = Q5Block(4);
  PutF16(b, 0, 0.25f);
  PutF16(b, 2, 3.0f);
  std::vector<float> expected(32);
  for (int i = 0; i < 32; ++i) expected[i] = 0.25f * i + 3.0f;
  EXPECT_THAT(Dequantize(DType::kQ5_1, b, 32), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q8_0HandBuiltBlock) {
  std::vector<uint8_t> b(34);
  PutF16(b, 0, 0.25f);
  std::vector<float> expected(32);
  for (int i = 0; i < 32; ++i) {
    const int8_t q = static_cast<int8_t>(8 * i - 128);
    b[2 + i] = static_cast<uint8_t>(q);
    expected[i] = 0.25f * q;
  }
  EXPECT_THAT(Dequantize(DType::kQ8_0, b, 32), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q2_KHandBuiltBlock) {
  std::vector<uint8_t> b(84);
  PutF16(b, 80, 1.0f);
  PutF16(b, 82, 0.5f);
  std::vector<float> expected(256);
  for (int sub = 0; sub < 16; ++sub)
    b[sub] = static_cast<uint8_t>(sub | (15 - sub) << 4);
  for (int e = 0; e < 256; ++e) {
    const int q = (7 * e + 3) % 4;
    const int j = e / 128, s = (e % 128) / 32, l = e % 32;
    b[16 + 32 * j + l] |= static_cast<uint8_t>(q << (2 * s));
    const int sub = e / 16;
    expected[e] = 1.0f * sub * q - 0.5f * (15 - sub);
  }
  EXPECT_THAT(Dequantize(DType::kQ2_K, b, 256), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q3_KHandBuiltBlock) {
  std::vector<uint8_t> b(110);
  PutF16(b, 108, 0.5f);
  int s6[16];
  for (int sub = 0; sub < 16; ++sub) s6[sub] = (5 * sub + 7) % 64;
  for (int i = 0; i < 8; ++i)
    b[96 + i] = static_cast<uint8_t>((s6[i] & 0xF) | (s6[8 + i] & 0xF) << 4);
  for (int sub = 0; sub < 16; ++sub) {
    b[96 + 8 + sub % 4] |=
        static_cast<uint8_t>(((s6[sub] >> 4) & 3) << (2 * (sub / 4)));
  }
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (3 * e) % 8 - 4;  // -4..3
    const int high = q >= 0 ? 1 : 0;
    const int low = q >= 0 ? q : q + 4;
    b[e % 32] |= static_cast<uint8_t>(high << (e / 32));
    const int j = e / 128, s = (e % 128) / 32, l = e % 32;
    b[32 + 32 * j + l] |= static_cast<uint8_t>(low << (2 * s));
    expected[e] = 0.5f * (s6[e / 16] - 32) * q;
  }
  EXPECT_THAT(Dequantize(DType::kQ3_K, b, 256), ElementsAreArray(expected));
}

// The 12-byte scale/min packing shared by Q4_K and Q5_K.
void PackScaleMin(const int sc[8], const int mn[8], uint8_t* s) {
  for (int i = 0; i < 4; ++i) {
    s[i] = static_cast<uint8_t>(sc[i] | (sc[4 + i] >> 4) << 6);
    s[4 + i] = static_cast<uint8_t>(mn[i] | (mn[4 + i] >> 4) << 6);
    s[8 + i] = static_cast<uint8_t>((sc[4 + i] & 0xF) | (mn[4 + i] & 0xF) << 4);
  }
}

TEST(DequantizeTest, Q4_KHandBuiltBlock) {
  std::vector<uint8_t> b(144);
  PutF16(b, 0, 0.5f);
  PutF16(b, 2, 0.25f);
  int sc[8], mn[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = 63 - 7 * i;
    mn[i] = 9 * i;
  }
  PackScaleMin(sc, mn, &b[4]);
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (5 * e) % 16;
    const int sub = e / 32;
    b[16 + 32 * (sub / 2) + e % 32] |=
        static_cast<uint8_t>(q << (4 * (sub % 2)));
    expected[e] = 0.5f * sc[sub] * q - 0.25f * mn[sub];
  }
  EXPECT_THAT(Dequantize(DType::kQ4_K, b, 256), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q5_KHandBuiltBlock) {
  std::vector<uint8_t> b(176);
  PutF16(b, 0, 0.25f);
  PutF16(b, 2, 2.0f);
  int sc[8], mn[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = 5 + 8 * i;
    mn[i] = 62 - 5 * i;
  }
  PackScaleMin(sc, mn, &b[4]);
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (13 * e + 1) % 32;
    const int sub = e / 32;
    b[48 + 32 * (sub / 2) + e % 32] |=
        static_cast<uint8_t>((q & 0xF) << (4 * (sub % 2)));
    b[16 + e % 32] |= static_cast<uint8_t>((q >> 4) << sub);
    expected[e] = 0.25f * sc[sub] * q - 2.0f * mn[sub];
  }
  EXPECT_THAT(Dequantize(DType::kQ5_K, b, 256), ElementsAreArray(expected));
}

TEST(DequantizeTest, Q6_KHandBuiltBlock) {
  std::vector<uint8_t> b(210);
  PutF16(b, 208, 0.125f);
  int8_t sc[16];
  for (int sub = 0; sub < 16; ++sub) {
    sc[sub] = static_cast<int8_t>(17 * sub - 128);
    b[192 + sub] = static_cast<uint8_t>(sc[sub]);
  }
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int q = (11 * e) % 64;
    const int j = e / 128, r = e % 128;
    b[64 * j + r % 64] |= static_cast<uint8_t>((q & 0xF) << (4 * (r / 64)));
    b[128 + 32 * j + r % 32] |=
        static_cast<uint8_t>((q >> 4) << (2 * (r / 32)));
    expected[e] = 0.125f * sc[e / 16] * (q - 32);
  }
  EXPECT_THAT(Dequantize(DType::kQ6_K, b, 256), ElementsAreArray(expected));
}

TEST(DequantizeTest, PlainTypesKeepEveryBit) {
  const uint16_t halves[] = {0x3C00, 0x0001, 0x7BFF, 0xFC00, 0x8000};
  std::vector<uint8_t> f16(sizeof(halves));
  std::memcpy(f16.data(), halves, sizeof(halves));
  EXPECT_THAT(Dequantize(DType::kF16, f16, 5),
              ElementsAreArray(
                  {1.0f, std::ldexp(1.0f, -24), 65504.0f, -INFINITY, -0.0f}));

  const uint16_t bf16[] = {0x3F80, 0xC000, 0x0001};
  std::vector<uint8_t> bf(sizeof(bf16));
  std::memcpy(bf.data(), bf16, sizeof(bf16));
  EXPECT_THAT(
      Dequantize(DType::kBF16, bf, 3),
      ElementsAreArray({1.0f, -2.0f, std::bit_cast<float>(0x00010000u)}));

  const uint32_t bits[] = {0x7FC01234u, 0x80000000u, 0x00000001u};
  std::vector<uint8_t> f32(sizeof(bits));
  std::memcpy(f32.data(), bits, sizeof(bits));
  const std::vector<float> out = Dequantize(DType::kF32, f32, 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), bits[i]);
}

TEST(DequantizeTest, RejectsCountsThatAreNotWholeBlocks) {
  std::vector<uint8_t> b(2 * 144);
  std::vector<float> out(512);
  absl::Status s = DequantizeRow(DType::kQ4_K, b.data(), out.data(), 255);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("256"));
  s = DequantizeRow(DType::kQ4_0, b.data(), out.data(), -32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeRow(DType::kQ4_0, nullptr, nullptr, 0).ok());
}

TEST(DequantizeTest, RejectsUnsupportedTypesByName) {
  for (DType dtype :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1,
        DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_TRUE(CanDequantize(dtype)) << DTypeName(dtype);
  }
  float out[32];
  uint8_t src[64] = {};
  for (DType dtype : {DType::kQ8_1, DType::kQ8_K, DType::kI32, DType::kF64}) {
    EXPECT_FALSE(CanDequantize(dtype));
    const absl::Status s = DequantizeRow(dtype, src, out, 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(s.message(), HasSubstr(std::string(DTypeName(dtype))));
  }
  const absl::Status s = DequantizeRow(static_cast<DType>(99), src, out, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("99"));
}

TEST(DequantizeTest, TensorChecksItsViewAndKeepsRowOrder) {
  std::vector<uint8_t> b(2 * 20);
  PutF16(b, 0, 1.0f);  // row 0: d = 1, m = 0, q = 0
  PutF16(b, 20, 0.0f);
  PutF16(b, 22, 7.0f);  // row 1: every value is m = 7
  TensorView view{"w", DType::kQ4_1, {2, 32}, b.data(), b.size()};
  absl::StatusOr<std::vector<float>> out = DequantizeTensor(view);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 64u);
  EXPECT_EQ((*out)[0], 0.0f);
  EXPECT_EQ((*out)[63], 7.0f);

  view.nbytes = 39;
  EXPECT_EQ(DequantizeTensor(view).status().code(),
            absl::StatusCode::kInvalidArgument);
  view.nbytes = 40;
  view.data = nullptr;
  EXPECT_EQ(DequantizeTensor(view).status().code(),
            absl::StatusCode::kInvalidArgument);
  TensorView ragged{"r", DType::kQ4_1, {1, 31}, b.data(), 20};
  EXPECT_EQ(DequantizeTensor(ragged).status().code(),
            absl::StatusCode::kInvalidArgument);
  TensorView ints{"i", DType::kI32, {4}, b.data(), 16};
  EXPECT_THAT(DequantizeTensor(ints).status().message(), HasSubstr("I32"));
}

// ---------------------------------------------------------------------------
// Bit-for-bit comparison with the gguf package
// (scripts/reference/gguf_dequant_reference.py).

std::string RequireEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    ADD_FAILURE() << name
                  << " is not set; run this test through ctest after "
                     "scripts/setup.sh has created the venv and the model";
    return "";
  }
  return value;
}

std::string ShellQuote(absl::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

struct PipeCloser {
  void operator()(FILE* f) const { pclose(f); }
};
using Pipe = std::unique_ptr<FILE, PipeCloser>;

bool ReadExact(FILE* f, void* dst, size_t n) {
  return std::fread(dst, 1, n, f) == n;
}

struct Comparison {
  int64_t tensors = 0;
  int64_t elements = 0;
  int64_t nan_pairs = 0;  // both NaN with different bits (quantized only)
  std::set<DType> dtypes;
};

// Compares DequantizeTensor on every tensor of `gguf_path` with the
// reference's stream. Float bits must be equal; for quantized types a NaN
// from inf/NaN scale arithmetic need only be NaN on both sides.
void CompareWithReference(const std::string& gguf_path, Comparison* result) {
  const std::string python = RequireEnv("BATON_PYTHON");
  const std::string source = RequireEnv("BATON_SOURCE_DIR");
  ASSERT_FALSE(python.empty() || source.empty());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(gguf_path);
  ASSERT_TRUE(file.ok()) << file.status();

  const std::string command = absl::StrCat(
      ShellQuote(python), " ",
      ShellQuote(source + "/scripts/reference/gguf_dequant_reference.py"), " ",
      ShellQuote(gguf_path));
  Pipe pipe(popen(command.c_str(), "r"));
  ASSERT_NE(pipe, nullptr) << "cannot run " << command;

  std::vector<float> expected;
  for (const GgufTensorInfo& info : (*file)->tensors()) {
    uint32_t name_len = 0;
    ASSERT_TRUE(ReadExact(pipe.get(), &name_len, sizeof(name_len)))
        << "reference stream ended after " << result->tensors << " tensors ("
        << command << ")";
    ASSERT_LE(name_len, 1u << 16);
    std::string name(name_len, '\0');
    uint64_t count = 0;
    ASSERT_TRUE(ReadExact(pipe.get(), name.data(), name_len));
    ASSERT_TRUE(ReadExact(pipe.get(), &count, sizeof(count)));
    ASSERT_EQ(name, info.name) << "tensor #" << result->tensors;
    const TensorView view = (*file)->View(info);
    ASSERT_EQ(count, static_cast<uint64_t>(view.NumElements())) << name;
    expected.resize(count);
    ASSERT_TRUE(ReadExact(pipe.get(), expected.data(), count * sizeof(float)))
        << name;

    absl::StatusOr<std::vector<float>> actual = DequantizeTensor(view);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ASSERT_EQ(actual->size(), count);
    const bool arithmetic = info.dtype != DType::kF32 &&
                            info.dtype != DType::kF16 &&
                            info.dtype != DType::kBF16;
    if (std::memcmp(actual->data(), expected.data(), count * sizeof(float))) {
      for (uint64_t i = 0; i < count; ++i) {
        const float a = (*actual)[i], e = expected[i];
        if (std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(e)) continue;
        if (arithmetic && std::isnan(a) && std::isnan(e)) {
          ++result->nan_pairs;
          continue;
        }
        FAIL() << name << " (" << DTypeName(info.dtype) << ") element " << i
               << ": Baton " << a << " (0x" << std::hex
               << std::bit_cast<uint32_t>(a) << "), gguf " << std::dec << e
               << " (0x" << std::hex << std::bit_cast<uint32_t>(e) << ")";
      }
    }
    ++result->tensors;
    result->elements += static_cast<int64_t>(count);
    result->dtypes.insert(info.dtype);
  }
  EXPECT_EQ(std::fgetc(pipe.get()), EOF) << "reference wrote extra tensors";
  EXPECT_EQ(pclose(pipe.release()), 0) << command << " failed";
  EXPECT_EQ(result->tensors, static_cast<int64_t>((*file)->tensors().size()));
}

TEST(DequantizeReferenceTest, MatchesGgufPackageOnEveryTensorOfDefaultModel) {
  const std::string model = RequireEnv("BATON_DEFAULT_MODEL");
  ASSERT_FALSE(model.empty());
  ASSERT_EQ(access(model.c_str(), R_OK), 0)
      << model << " is missing; scripts/setup.sh fetches it";
  Comparison result;
  ASSERT_NO_FATAL_FAILURE(CompareWithReference(model, &result));
  EXPECT_EQ(result.tensors, 272);
  EXPECT_EQ(result.nan_pairs, 0);
  EXPECT_EQ(result.dtypes,
            (std::set<DType>{DType::kF32, DType::kQ4_1, DType::kQ8_0}));
  std::printf("compared %lld tensors, %lld elements bit for bit\n",
              static_cast<long long>(result.tensors),
              static_cast<long long>(result.elements));
}

TEST(DequantizeReferenceTest, MatchesGgufPackageOnExtremeBlocks) {
  const std::string python = RequireEnv("BATON_PYTHON");
  const std::string source = RequireEnv("BATON_SOURCE_DIR");
  ASSERT_FALSE(python.empty() || source.empty());
  const std::string path = absl::StrCat(
      ::testing::TempDir(), "dequant_extreme_blocks_", getpid(), ".gguf");
  const std::string command = absl::StrCat(
      ShellQuote(python), " ",
      ShellQuote(source + "/scripts/reference/make_extreme_blocks.py"), " ",
      ShellQuote(path));
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Comparison result;
  CompareWithReference(path, &result);
  std::remove(path.c_str());
  ASSERT_FALSE(HasFatalFailure());
  // Every supported type is covered.
  for (DType dtype :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1,
        DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_TRUE(result.dtypes.count(dtype)) << DTypeName(dtype);
  }
  std::printf(
      "compared %lld tensors, %lld elements (%lld NaN pairs with different "
      "payloads)\n",
      static_cast<long long>(result.tensors),
      static_cast<long long>(result.elements),
      static_cast<long long>(result.nan_pairs));
}

}  // namespace
}  // namespace baton
