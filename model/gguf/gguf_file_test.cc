#include "model/gguf/gguf_file.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_builder_for_test.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::baton::testing::GgufBuilder;
using ::testing::HasSubstr;

// A small valid file: every scalar type, a string array, a nested array, and
// two tensors (F32 [2,3] and Q8_0 [1,32]).
std::vector<uint8_t> ValidFile() {
  GgufBuilder b;
  b.Header(/*n_tensors=*/2, /*n_kv=*/16);
  b.Key("u8", 0).Put<uint8_t>(200);
  b.Key("i8", 1).Put<int8_t>(-100);
  b.Key("u16", 2).Put<uint16_t>(60000);
  b.Key("i16", 3).Put<int16_t>(-30000);
  b.Key("u32", 4).Put<uint32_t>(4000000000u);
  b.Key("i32", 5).Put<int32_t>(-2000000000);
  b.Key("f32", 6).Put<float>(1.5f);
  b.Key("bool", 7).Put<uint8_t>(1);
  b.Key("str", 8).Str("héllo");
  b.Key("u64", 10).Put<uint64_t>(1ull << 40);
  b.Key("i64", 11).Put<int64_t>(-(1ll << 40));
  b.Key("f64", 12).Put<double>(-2.25);
  b.Key("strings", 9)
      .Put<uint32_t>(8)
      .Put<uint64_t>(3)
      .Str("a")
      .Str("")
      .Str("ccc");
  b.Key("ints", 9)
      .Put<uint32_t>(5)
      .Put<uint64_t>(3)
      .Put<int32_t>(7)
      .Put<int32_t>(-8)
      .Put<int32_t>(9);
  b.Key("nested", 9).Put<uint32_t>(9).Put<uint64_t>(2);
  b.Put<uint32_t>(4).Put<uint64_t>(1).Put<uint32_t>(42);
  b.Put<uint32_t>(8).Put<uint64_t>(2).Str("x").Str("yz");
  b.Key("general.alignment", 4).Put<uint32_t>(64);
  b.TensorInfo("w", {3, 2}, /*F32=*/0, 0);
  b.TensorInfo("q", {32, 1}, /*Q8_0=*/8, 64);
  b.PadTo(64);
  for (int i = 0; i < 6; ++i) b.Put<float>(static_cast<float>(i) * 0.5f);
  b.Fill(64 - 24, 0);
  b.Fill(34, 7);
  return b.bytes();
}

TEST(GgufFileTest, ParsesEveryValueType) {
  std::vector<uint8_t> bytes = ValidFile();
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(*f.GetInt("u8"), 200);
  EXPECT_EQ(*f.GetInt("i8"), -100);
  EXPECT_EQ(*f.GetInt("u16"), 60000);
  EXPECT_EQ(*f.GetInt("i16"), -30000);
  EXPECT_EQ(*f.GetInt("u32"), 4000000000ll);
  EXPECT_EQ(*f.GetInt("i32"), -2000000000);
  EXPECT_EQ(*f.GetFloat("f32"), 1.5);
  EXPECT_EQ(*f.GetBool("bool"), true);
  EXPECT_EQ(*f.GetString("str"), "héllo");
  EXPECT_EQ(*f.GetInt("u64"), 1ll << 40);
  EXPECT_EQ(*f.GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(*f.GetFloat("f64"), -2.25);
  auto strings = f.GetArray("strings", GgufType::kString);
  ASSERT_TRUE(strings.ok()) << strings.status();
  ASSERT_EQ((*strings)->size(), 3u);
  EXPECT_EQ((*strings)->GetString(0), "a");
  EXPECT_EQ((*strings)->GetString(1), "");
  EXPECT_EQ((*strings)->GetString(2), "ccc");
  auto ints = f.GetArray("ints", GgufType::kInt32);
  ASSERT_TRUE(ints.ok());
  EXPECT_EQ(*(*ints)->Get(1).AsInt(), -8);
  auto nested = f.GetArray("nested", GgufType::kArray);
  ASSERT_TRUE(nested.ok()) << nested.status();
  GgufValue first = (*nested)->Get(0);
  const GgufArray& inner0 = std::get<GgufArray>(first.value);
  EXPECT_EQ(*inner0.Get(0).AsInt(), 42);
  GgufValue second = (*nested)->Get(1);
  EXPECT_EQ(std::get<GgufArray>(second.value).GetString(1), "yz");
  EXPECT_EQ(f.Find("nested")->DebugString(), "array[2]");
  EXPECT_EQ(f.Find("ints")->DebugString(), "int32[3] {7, -8, 9}");

  ASSERT_EQ(f.tensors().size(), 2u);
  auto w = f.GetTensor("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->nbytes, 24u);
  EXPECT_EQ(reinterpret_cast<const float*>(w->data)[5], 2.5f);
  EXPECT_EQ(w->data - bytes.data(), static_cast<ptrdiff_t>(f.data_offset()));
  auto q = f.GetTensor("q");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->dtype, DType::kQ8_0);
  EXPECT_EQ(q->nbytes, 34u);
  EXPECT_EQ(q->data[0], 7);
}

TEST(GgufFileTest, TypedGettersNameKeyAndTypes) {
  std::vector<uint8_t> bytes = ValidFile();
  auto file = GgufFile::Parse(bytes);
  ASSERT_TRUE(file.ok());
  auto missing = (*file)->GetInt("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
  auto wrong = (*file)->GetString("u8");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("'u8' should be a string, but is uint8"));
  auto wrong_elem = (*file)->GetArray("ints", GgufType::kString);
  EXPECT_THAT(std::string(wrong_elem.status().message()),
              HasSubstr("elements are int32"));
  EXPECT_EQ(*(*file)->GetIntOr("nope", 5), 5);
  EXPECT_FALSE((*file)->GetIntOr("str", 5).ok());
  EXPECT_EQ((*file)->GetTensor("nope").status().code(),
            absl::StatusCode::kNotFound);
}

// Every strict prefix of a valid file is rejected cleanly (no crash, no
// out-of-bounds read under ASan), naming truncation or a past-the-end tensor.
TEST(GgufFileTest, EveryTruncationIsAnError) {
  std::vector<uint8_t> bytes = ValidFile();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    auto file = GgufFile::Parse(prefix);
    ASSERT_FALSE(file.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

struct BadCase {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  auto add = [&](std::string name, GgufBuilder& b, std::string message) {
    cases.push_back({std::move(name), b.bytes(), std::move(message)});
  };
  {
    GgufBuilder b;
    b.Put<uint32_t>(0x46554746)
        .Put<uint32_t>(3)
        .Put<uint64_t>(0)
        .Put<uint64_t>(0);
    add("BadMagic", b, "bad magic");
  }
  {
    GgufBuilder b;
    b.Header(0, 0, /*version=*/1);
    add("Version1", b, "version 1");
  }
  {
    GgufBuilder b;
    b.Header(0, 0, /*version=*/0x03000000);
    add("BigEndian", b, "big-endian");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Put<uint64_t>(1ull << 63).Fill(16, 0);
    add("HugeKeyLength", b, "has length 9223372036854775808");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("s", 8).Put<uint64_t>(1ull << 63);
    add("HugeStringLength", b, "metadata 's' at offset 37 has length");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("a", 9).Put<uint32_t>(4).Put<uint64_t>(1ull << 61);
    add("HugeArrayCount", b, "array of 2305843009213693952 uint32");
  }
  {
    GgufBuilder b;
    b.Header(0, 1ull << 60);
    add("HugeMetadataCount", b, "metadata count");
  }
  {
    GgufBuilder b;
    b.Header(1ull << 60, 0);
    add("HugeTensorCount", b, "tensor count");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("x", 13).Put<uint32_t>(0);
    add("UnknownValueType", b, "unknown value type 13");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("a", 9).Put<uint32_t>(77).Put<uint64_t>(0);
    add("UnknownArrayElementType", b, "unknown value type 77");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("b", 7).Put<uint8_t>(2);
    add("BoolOutOfRange", b, "bool has value 2");
  }
  {
    GgufBuilder b;
    b.Header(0, 2).Key("k", 4).Put<uint32_t>(1).Key("k", 4).Put<uint32_t>(2);
    add("DuplicateKey", b, "duplicate metadata key 'k'");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("general.alignment", 4).Put<uint32_t>(48);
    add("AlignmentNotPowerOfTwo", b, "power of two, got 48");
  }
  {
    GgufBuilder b;
    b.Header(0, 1).Key("deep", 9);
    for (int i = 0; i < 20; ++i) b.Put<uint32_t>(9).Put<uint64_t>(1);
    add("ArraysTooDeep", b, "nested deeper than 8");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {32}, /*type=*/99, 0);
    add("UnknownTensorType", b, "unknown tensor type 99");
  }
  {
    // Baton's load-time Q4_K_R layout is not a file type.
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {32}, /*type=*/4096, 0);
    add("InternalTensorType", b, "unknown tensor type 4096");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {1, 1, 1, 1, 1}, 0, 0);
    add("TooManyDims", b, "5 dimensions");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {1ull << 40, 1ull << 40}, 0, 0);
    add("ShapeOverflow", b, "overflows");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {1ull << 63}, 0, 0);
    add("DimensionPastInt64", b, "dimension 0 is 9223372036854775808");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {33}, /*Q4_0=*/2, 0);
    add("RowNotMultipleOfBlock", b, "not a multiple of Q4_0's block size 32");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {4}, 0, 16);
    add("UnalignedOffset", b, "not a multiple of the alignment 32");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {1024}, 0, 0).PadTo(32).Fill(100, 0);
    add("TensorPastEnd", b, "extends past the end");
  }
  {
    GgufBuilder b;
    b.Header(1, 0).TensorInfo("t", {4}, 0, 1ull << 62).PadTo(32).Fill(16, 0);
    add("OffsetPastEnd", b, "extends past the end");
  }
  {
    GgufBuilder b;
    b.Header(2, 0).TensorInfo("t", {4}, 0, 0).TensorInfo("t", {4}, 0, 32);
    add("DuplicateTensorName", b, "duplicate tensor name 't'");
  }
  return cases;
}

class GgufBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(GgufBadInputTest, RejectedWithClearMessage) {
  auto file = GgufFile::Parse(GetParam().bytes);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufBadInputTest,
                         ::testing::ValuesIn(BadCases()),
                         [](const auto& info) { return info.param.name; });

TEST(GgufFileTest, OpenNamesThePath) {
  auto file = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("/nonexistent/model.gguf"));
}

// The default model, read by Baton and by the `gguf` PyPI package, must agree
// on every metadata value and every tensor's type, shape and offset.
TEST(GgufFileTest, DefaultModelMatchesGgufPackage) {
  std::string model = testing::DefaultModelPath();
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status()
                         << " (run scripts/setup.sh to fetch the model)";
  auto out =
      testing::RunCommand(testing::PythonPath() + " " + testing::SourceDir() +
                          "/scripts/reference/gguf_inventory.py " + model);
  ASSERT_TRUE(out.ok()) << out.status();
  nlohmann::json ref = nlohmann::json::parse(*out);
  const GgufFile& f = **file;

  ASSERT_EQ(ref["metadata"].size(), f.metadata().size());
  for (const auto& entry : ref["metadata"]) {
    std::string key = entry["key"];
    const GgufValue* v = f.Find(key);
    ASSERT_NE(v, nullptr) << key;
    ASSERT_EQ(static_cast<int>(v->type()), entry["type"].get<int>()) << key;
    if (v->type() == GgufType::kArray) {
      const GgufArray& a = std::get<GgufArray>(v->value);
      EXPECT_EQ(a.size(), entry["length"].get<size_t>()) << key;
      EXPECT_EQ(static_cast<int>(a.element_type()),
                entry["element_type"].get<int>())
          << key;
      const auto& head = entry["head"];
      for (size_t i = 0; i < head.size(); ++i) {
        GgufValue e = a.Get(i);
        if (head[i].is_string()) {
          EXPECT_EQ(a.GetString(i), head[i].get<std::string>()) << key << i;
        } else if (head[i].is_number_integer()) {
          EXPECT_EQ(*e.AsInt(), head[i].get<int64_t>()) << key << i;
        } else if (head[i].is_number_float()) {
          EXPECT_EQ(*e.AsFloat(), head[i].get<double>()) << key << i;
        }
      }
    } else if (v->type() == GgufType::kString) {
      EXPECT_EQ(*f.GetString(key), entry["value"].get<std::string>()) << key;
    } else if (v->type() == GgufType::kBool) {
      EXPECT_EQ(*f.GetBool(key), entry["value"].get<bool>()) << key;
    } else if (v->type() == GgufType::kFloat32 ||
               v->type() == GgufType::kFloat64) {
      EXPECT_EQ(*f.GetFloat(key), entry["value"].get<double>()) << key;
    } else {
      EXPECT_EQ(*f.GetInt(key), entry["value"].get<int64_t>()) << key;
    }
  }

  const auto& tensors = ref["tensors"];
  ASSERT_EQ(tensors.size(), 272u);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, tensors[i]["name"].get<std::string>());
    EXPECT_EQ(static_cast<int>(t.dtype), tensors[i]["type"].get<int>())
        << t.name;
    EXPECT_EQ(t.shape, tensors[i]["shape"].get<std::vector<int64_t>>())
        << t.name;
    EXPECT_EQ(t.offset, tensors[i]["offset"].get<uint64_t>()) << t.name;
    EXPECT_EQ(t.nbytes, tensors[i]["nbytes"].get<uint64_t>()) << t.name;
  }
}

}  // namespace
}  // namespace baton
