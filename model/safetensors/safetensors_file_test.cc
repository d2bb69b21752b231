#include "model/safetensors/safetensors_file.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "model/safetensors/safetensors_test_util.h"

namespace baton {
namespace {

using ::baton::testing::BuildSafetensors;
using ::baton::testing::F32Bytes;
using ::baton::testing::RawSafetensors;
using ::baton::testing::TestTensor;
using ::baton::testing::U16Bytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<float> RandomFloats(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(SafetensorsFileTest, ReadsEveryComputeDTypeScalarEmptyAndMetadata) {
  std::mt19937 rng(7);
  std::vector<float> f32 = RandomFloats(rng, 6);
  std::vector<uint16_t> f16, bf16;
  for (float x : RandomFloats(rng, 4)) f16.push_back(F32ToF16(x));
  for (float x : RandomFloats(rng, 4)) bf16.push_back(F32ToBF16(x));
  std::string file =
      BuildSafetensors({{"w.f32", "F32", {2, 3}, F32Bytes(f32)},
                        {"w.f16", "F16", {4}, U16Bytes(f16)},
                        {"w.bf16", "BF16", {2, 2}, U16Bytes(bf16)},
                        {"scalar", "F32", {}, F32Bytes({3.5f})},
                        {"empty", "F32", {0, 3}, ""}},
                       {{"format", "pt"}, {"note", "baton"}});
  auto parsed = SafetensorsFile::Parse(Bytes(file));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const SafetensorsFile& st = **parsed;

  std::vector<std::string> names;
  for (const auto& t : st.tensors()) names.push_back(t.name);
  EXPECT_THAT(names,
              ElementsAre("empty", "scalar", "w.bf16", "w.f16", "w.f32"));
  EXPECT_EQ(st.data_offset() % 8, 0u);
  EXPECT_EQ(st.data_offset(), 8 + st.header_size());
  ASSERT_NE(st.FindMetadata("format"), nullptr);
  EXPECT_EQ(*st.FindMetadata("format"), "pt");
  EXPECT_EQ(st.metadata().size(), 2u);
  EXPECT_EQ(st.FindMetadata("missing"), nullptr);

  auto f32_view = st.GetTensor("w.f32");
  ASSERT_TRUE(f32_view.ok()) << f32_view.status();
  EXPECT_EQ(f32_view->dtype, DType::kF32);
  EXPECT_THAT(f32_view->shape, ElementsAre(2, 3));
  ASSERT_EQ(f32_view->nbytes, 24u);
  EXPECT_EQ(std::memcmp(f32_view->data, f32.data(), 24), 0);
  EXPECT_EQ(f32_view->data, Bytes(file).data() + st.data_offset());

  auto f16_view = st.GetTensor("w.f16");
  ASSERT_TRUE(f16_view.ok()) << f16_view.status();
  EXPECT_EQ(f16_view->dtype, DType::kF16);
  EXPECT_THAT(f16_view->shape, ElementsAre(4));
  ASSERT_EQ(f16_view->nbytes, 8u);
  EXPECT_EQ(std::memcmp(f16_view->data, f16.data(), 8), 0);

  auto bf16_view = st.GetTensor("w.bf16");
  ASSERT_TRUE(bf16_view.ok()) << bf16_view.status();
  EXPECT_EQ(bf16_view->dtype, DType::kBF16);
  EXPECT_THAT(bf16_view->shape, ElementsAre(2, 2));
  ASSERT_EQ(bf16_view->nbytes, 8u);
  EXPECT_EQ(std::memcmp(bf16_view->data, bf16.data(), 8), 0);

  auto scalar = st.GetTensor("scalar");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->NumElements(), 1);
  float value;
  std::memcpy(&value, scalar->data, 4);
  EXPECT_EQ(value, 3.5f);

  auto empty = st.GetTensor("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(empty->shape, ElementsAre(0, 3));
  EXPECT_EQ(empty->nbytes, 0u);
  EXPECT_EQ(empty->NumElements(), 0);
}

TEST(SafetensorsFileTest, OpenMapsAFileAndNamesItInErrors) {
  testing::TempDir temp;
  const std::string& dir = temp.path();
  std::string good = dir + "/good.safetensors";
  testing::WriteFile(good,
                     BuildSafetensors({{"a", "F32", {2}, F32Bytes({1, 2})}}));
  auto st = SafetensorsFile::Open(good);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)->path(), good);
  EXPECT_EQ((*st)->file_size(), (*st)->data_offset() + 8);
  auto view = (*st)->GetTensor("a");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(testing::LoadF32(view->data + 4 * 1), 2.0f);

  auto missing = (*st)->GetTensor("b");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'b'"));

  std::string bad = dir + "/bad.safetensors";
  testing::WriteFile(bad, "abc");
  auto short_file = SafetensorsFile::Open(bad);
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_file.status().message(), HasSubstr(bad));

  EXPECT_EQ(SafetensorsFile::Open(dir + "/nope.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, ListsOtherDTypesButViewsOnlyComputeDTypes) {
  std::string file =
      BuildSafetensors({{"ids", "I64", {2}, std::string(16, '\1')},
                        {"mask", "BOOL", {3}, std::string(3, '\1')},
                        {"fp8", "F8_E4M3", {2, 2}, std::string(4, '\0')},
                        {"fp4", "F4", {4}, std::string(2, '\0')}});
  auto st = SafetensorsFile::Parse(Bytes(file));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ((*st)->tensors().size(), 4u);
  const SafetensorsTensorInfo* ids = (*st)->FindTensor("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype_name, "I64");
  EXPECT_FALSE(ids->dtype.has_value());
  EXPECT_EQ(ids->nbytes, 16u);
  EXPECT_EQ((*st)->FindTensor("fp4")->nbytes, 2u);
  auto view = (*st)->GetTensor("ids");
  EXPECT_EQ(view.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(view.status().message(), HasSubstr("'ids'"));
  EXPECT_THAT(view.status().message(), HasSubstr("I64"));
  auto fp8 = (*st)->GetTensor("fp8");
  EXPECT_EQ(fp8.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(fp8.status().message(), HasSubstr("F8_E4M3"));
}

TEST(SafetensorsFileTest, AcceptsEmptyHeaderOverlapAndGaps) {
  auto empty = SafetensorsFile::Parse(Bytes(RawSafetensors("{}", "")));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->tensors().empty());

  // "b" aliases the second half of "a"; bytes 16..19 belong to no tensor.
  std::string data = F32Bytes({1, 2, 3, 4, 5});
  std::string file = RawSafetensors(
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      data);
  auto st = SafetensorsFile::Parse(Bytes(file));
  ASSERT_TRUE(st.ok()) << st.status();
  auto b = (*st)->GetTensor("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(testing::LoadF32(b->data), 3.0f);
}

// One malformed input and what its error must say.
struct BadCase {
  std::string label;
  std::string file;
  std::vector<std::string> message_parts;
};

// A header with one tensor entry `entry` over `data_size` zero bytes.
std::string OneEntry(absl::string_view entry, size_t data_size = 16) {
  return RawSafetensors(absl::StrCat("{\"t\":", entry, "}"),
                        std::string(data_size, '\0'));
}

std::string WithLength(uint64_t n, absl::string_view rest) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  return absl::StrCat(out, rest);
}

std::vector<BadCase> BadCases() {
  const std::string ok_offsets = R"("data_offsets":[0,16])";
  std::string deep = std::string(40, '[') + std::string(40, ']');
  return {
      {"empty file", "", {"0 bytes", "shorter than the 8-byte header length"}},
      {"7 bytes", std::string(7, '\0'), {"7 bytes", "offset 0"}},
      {"header past end",
       WithLength(100, "{}"),
       {"header length 100", "offset 0", "larger than the 2 bytes after it"}},
      {"header over limit",
       WithLength(uint64_t{200} << 20, "{}"),
       {"header length 209715200", "exceeds the limit of 104857600"}},
      {"huge header length",
       WithLength(~uint64_t{0}, "{}"),
       {"exceeds the limit"}},
      {"malformed JSON",
       RawSafetensors(R"({"t": {"dtype": )", ""),
       {"malformed JSON at byte offset 24"}},
      {"trailing garbage",
       RawSafetensors("{} x", ""),
       {"malformed JSON at byte offset 11"}},
      {"invalid UTF-8", RawSafetensors("{\"\xff\":1}", ""), {"malformed JSON"}},
      {"header is array",
       RawSafetensors("[1,2]", ""),
       {"header must be a JSON object, got a JSON array"}},
      {"header is string",
       RawSafetensors("\"abc\"", ""),
       {"header must be a JSON object, got a JSON string"}},
      {"entry not object",
       OneEntry("3"),
       {"tensor 't'", "entry must be a JSON object, got a JSON integer"}},
      {"missing dtype",
       OneEntry(R"({"shape":[4],)" + ok_offsets + "}"),
       {"tensor 't'", "missing \"dtype\""}},
      {"missing shape",
       OneEntry(R"({"dtype":"F32",)" + ok_offsets + "}"),
       {"tensor 't'", "missing \"shape\""}},
      {"missing data_offsets",
       OneEntry(R"({"dtype":"F32","shape":[4]})"),
       {"tensor 't'", "missing \"data_offsets\""}},
      {"dtype not string",
       OneEntry(R"({"dtype":32,"shape":[4],)" + ok_offsets + "}"),
       {"tensor 't'", "\"dtype\" must be a JSON string, got a JSON integer"}},
      {"unknown dtype",
       OneEntry(R"({"dtype":"F7","shape":[4],)" + ok_offsets + "}"),
       {"tensor 't'", "unknown dtype \"F7\""}},
      {"shape not array",
       OneEntry(R"({"dtype":"F32","shape":"4",)" + ok_offsets + "}"),
       {"tensor 't'", "\"shape\" must be a JSON array, got a JSON string"}},
      {"data_offsets not array",
       OneEntry(R"({"dtype":"F32","shape":[4],"data_offsets":{}})"),
       {"tensor 't'", "\"data_offsets\" must be a JSON array"}},
      {"negative dim",
       OneEntry(R"({"dtype":"F32","shape":[4,-1],)" + ok_offsets + "}"),
       {"tensor 't'", "shape[1] is negative (-1)"}},
      {"fractional dim",
       OneEntry(R"({"dtype":"F32","shape":[2.5],)" + ok_offsets + "}"),
       {"tensor 't'", "shape[0] is not an integer (2.5)"}},
      {"dim is string",
       OneEntry(R"({"dtype":"F32","shape":["4"],)" + ok_offsets + "}"),
       {"tensor 't'", "shape[0] must be an integer, got a JSON string"}},
      {"dim above int64",
       OneEntry(R"({"dtype":"F32","shape":[9223372036854775808],)" +
                ok_offsets + "}"),
       {"tensor 't'", "shape[0] is 9223372036854775808, larger than 2^63-1"}},
      {"element count overflow",
       OneEntry(R"({"dtype":"F32","shape":[4294967296,4294967296],)" +
                ok_offsets + "}"),
       {"tensor 't'", "shape [4294967296, 4294967296]", "overflows int64"}},
      {"overflow hidden by zero",
       OneEntry(R"({"dtype":"F32","shape":[0,4294967296,4294967296],)"
                R"("data_offsets":[0,0]})"),
       {"tensor 't'", "overflows int64"}},
      {"byte count overflow",
       OneEntry(R"({"dtype":"F32","shape":[4611686018427387904],)" +
                ok_offsets + "}"),
       {"tensor 't'", "byte count of F32 shape [4611686018427387904]",
        "overflows int64"}},
      {"sub-byte dtype not whole bytes",
       OneEntry(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})"),
       {"tensor 't'", "not a whole number of bytes"}},
      {"begin > end",
       OneEntry(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})"),
       {"tensor 't'", "data_offsets [8, 4] have begin > end"}},
      {"end past data",
       OneEntry(R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})"),
       {"tensor 't'", "end past the data section of 16 bytes"}},
      {"size mismatch",
       OneEntry(R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})"),
       {"tensor 't'", "span 16 bytes", "F32 shape [3] needs 12"}},
      {"three offsets",
       OneEntry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16,16]})"),
       {"tensor 't'", "must hold 2 integers", "got 3"}},
      {"negative offset",
       OneEntry(R"({"dtype":"F32","shape":[0],"data_offsets":[-4,0]})"),
       {"tensor 't'", "data_offsets[0] is negative"}},
      {"duplicate tensor",
       RawSafetensors(
           R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
           R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           std::string(8, '\0')),
       {"duplicate key \"t\"", "top level"}},
      {"duplicate field",
       OneEntry(R"({"dtype":"F32","dtype":"F16","shape":[4],)" + ok_offsets +
                "}"),
       {"duplicate key \"dtype\"", "\"/t\""}},
      {"duplicate metadata key",
       RawSafetensors(R"({"__metadata__":{"a":"1","a":"2"}})", ""),
       {"duplicate key \"a\"", "\"/__metadata__\""}},
      {"metadata not object",
       RawSafetensors(R"({"__metadata__":[]})", ""),
       {"\"__metadata__\" must be a JSON object, got a JSON array"}},
      {"metadata value not string",
       RawSafetensors(R"({"__metadata__":{"n":1}})", ""),
       {"\"__metadata__\" value of \"n\" must be a JSON string"}},
      {"deep nesting", RawSafetensors(deep, ""), {"nests deeper than 32"}},
  };
}

TEST(SafetensorsFileTest, RejectsEachMalformedInputWithAClearMessage) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.label);
    auto st = SafetensorsFile::Parse(Bytes(c.file));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument)
        << st.status();
    EXPECT_THAT(st.status().message(), HasSubstr("safetensors buffer"));
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(st.status().message(), HasSubstr(part));
    }
  }
}

// Every truncation and every single-byte corruption of a valid file either
// parses to tensors inside the buffer or fails cleanly.
TEST(SafetensorsFileTest, TruncationsAndByteFlipsNeverEscapeTheBuffer) {
  std::string file =
      BuildSafetensors({{"a", "F32", {2, 2}, F32Bytes({1, 2, 3, 4})},
                        {"b", "BF16", {3}, U16Bytes({1, 2, 3})}},
                       {{"format", "pt"}});
  std::mt19937 rng(11);
  int parsed_ok = 0;
  for (size_t i = 0; i <= file.size(); ++i) {
    for (int variant = 0; variant < 2; ++variant) {
      std::string input = file;
      if (variant == 0) {
        input.resize(i);
      } else if (i < file.size()) {
        input[i] = static_cast<char>(rng() & 0xff);
      }
      auto st = SafetensorsFile::Parse(Bytes(input));
      if (!st.ok()) {
        EXPECT_FALSE(st.status().message().empty());
        continue;
      }
      ++parsed_ok;
      for (const auto& t : (*st)->tensors()) {
        EXPECT_LE(t.offset + t.nbytes, input.size());
      }
    }
  }
  EXPECT_GT(parsed_ok, 0);
}

}  // namespace
}  // namespace baton
