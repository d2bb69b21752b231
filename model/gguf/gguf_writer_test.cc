#include "model/gguf/gguf_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::testing::HasSubstr;

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "gguf_writer_test_", ::getpid(),
                      "_", name);
}

std::string Hex(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  for (size_t i = 0; i < size; ++i) absl::StrAppendFormat(&out, "%02x", p[i]);
  return out;
}
template <typename T>
std::string Hex(T v) {
  return Hex(&v, sizeof(T));
}

// One test tensor: its declaration and its bytes.
struct TestTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<TestTensor> MakeTensors(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TestTensor> tensors = {
      {"token_embd.weight", DType::kQ8_0, {7, 64}, {}},
      {"blk.0.attn_norm.weight", DType::kF32, {19}, {}},
      {"blk.0.ffn_up.weight", DType::kQ4_1, {3, 2, 96}, {}},
      {"blk.0.attn_q.weight", DType::kF16, {5, 1, 1, 3}, {}},
      {"odd", DType::kI8, {1}, {}},
      {"output.weight", DType::kQ4_0, {1, 32}, {}},
  };
  for (TestTensor& t : tensors) {
    t.bytes.resize(*TensorBytes(t.dtype, t.shape));
    for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
  }
  return tensors;
}

const std::vector<std::string> kStrings = {"", "a", "héllo wörld", "Ġthe",
                                           std::string("nul\0byte", 8)};

// Adds one key of every type, then arrays of every type. Returns the
// expected raw value bytes (without type tags) of each scalar key, and of
// each element of each array key, hex-encoded, keyed by metadata key.
std::map<std::string, std::vector<std::string>> AddAllMetadata(GgufWriter& w) {
  std::map<std::string, std::vector<std::string>> expect;
  EXPECT_TRUE(w.AddUint8("t.u8", 200).ok());
  expect["t.u8"] = {Hex<uint8_t>(200)};
  EXPECT_TRUE(w.AddInt8("t.i8", -100).ok());
  expect["t.i8"] = {Hex<int8_t>(-100)};
  EXPECT_TRUE(w.AddUint16("t.u16", 65000).ok());
  expect["t.u16"] = {Hex<uint16_t>(65000)};
  EXPECT_TRUE(w.AddInt16("t.i16", -32000).ok());
  expect["t.i16"] = {Hex<int16_t>(-32000)};
  EXPECT_TRUE(w.AddUint32("t.u32", 4000000000u).ok());
  expect["t.u32"] = {Hex<uint32_t>(4000000000u)};
  EXPECT_TRUE(w.AddInt32("t.i32", -2000000000).ok());
  expect["t.i32"] = {Hex<int32_t>(-2000000000)};
  EXPECT_TRUE(w.AddFloat32("t.f32", 1e-5f).ok());
  expect["t.f32"] = {Hex<float>(1e-5f)};
  EXPECT_TRUE(w.AddBool("t.bool", true).ok());
  expect["t.bool"] = {"01"};
  EXPECT_TRUE(w.AddString("t.str", "Smol ⚡ model").ok());
  expect["t.str"] = {Hex("Smol ⚡ model", std::strlen("Smol ⚡ model"))};
  EXPECT_TRUE(w.AddUint64("t.u64", 18000000000000000000ull).ok());
  expect["t.u64"] = {Hex<uint64_t>(18000000000000000000ull)};
  EXPECT_TRUE(w.AddInt64("t.i64", -9000000000000000000ll).ok());
  expect["t.i64"] = {Hex<int64_t>(-9000000000000000000ll)};
  EXPECT_TRUE(w.AddFloat64("t.f64", M_PI).ok());
  expect["t.f64"] = {Hex<double>(M_PI)};

  auto add_array = [&](const std::string& key, auto values) {
    using T = typename decltype(values)::value_type;
    EXPECT_TRUE(w.AddArray(key, std::span<const T>(values)).ok()) << key;
    for (T v : values) expect[key].push_back(Hex<T>(v));
  };
  add_array("a.u8", std::vector<uint8_t>{0, 1, 255});
  add_array("a.i8", std::vector<int8_t>{-128, 0, 127});
  add_array("a.u16", std::vector<uint16_t>{1, 65535});
  add_array("a.i16", std::vector<int16_t>{-1, 300});
  add_array("a.u32", std::vector<uint32_t>{7, 0xffffffffu, 49152});
  add_array("a.i32", std::vector<int32_t>{1, 3, 3, -6});
  add_array("a.f32",
            std::vector<float>{0.0f, -0.0f, 1.5f,
                               std::numeric_limits<float>::infinity()});
  add_array("a.u64", std::vector<uint64_t>{1ull << 40});
  add_array("a.i64", std::vector<int64_t>{-(1ll << 50), 5});
  add_array("a.f64", std::vector<double>{1e300, -2.5});
  EXPECT_TRUE(w.AddArray("a.empty", std::span<const int32_t>()).ok());
  expect["a.empty"] = {};
  bool bools[] = {true, false, true};
  EXPECT_TRUE(w.AddBoolArray("a.bool", bools).ok());
  expect["a.bool"] = {"01", "00", "01"};
  EXPECT_TRUE(w.AddStringArray("a.str", kStrings).ok());
  for (const std::string& s : kStrings) {
    expect["a.str"].push_back(Hex(s.data(), s.size()));
  }
  return expect;
}

// Writes the metadata and tensors above; each tensor arrives in `pieces`
// pieces (the last takes the remainder).
std::map<std::string, std::vector<std::string>> WriteTestFile(
    const std::string& path, const std::vector<TestTensor>& tensors,
    const GgufWriterOptions& options, int pieces) {
  auto writer = GgufWriter::Create(path, options);
  EXPECT_TRUE(writer.ok()) << writer.status();
  GgufWriter& w = **writer;
  auto expect = AddAllMetadata(w);
  for (const TestTensor& t : tensors) {
    EXPECT_TRUE(w.AddTensor(t.name, t.dtype, t.shape).ok()) << t.name;
  }
  for (const TestTensor& t : tensors) {
    size_t step = t.bytes.size() / pieces;
    size_t at = 0;
    for (int p = 0; p < pieces; ++p) {
      size_t n = p + 1 == pieces ? t.bytes.size() - at : step;
      absl::Status s =
          w.WriteTensorData(std::span<const uint8_t>(t.bytes.data() + at, n));
      EXPECT_TRUE(s.ok()) << s;
      at += n;
    }
  }
  uint64_t expected_size = w.ExpectedFileSize();
  absl::Status s = w.Finish();
  EXPECT_TRUE(s.ok()) << s;
  auto mapped = MappedFile::Open(path);
  EXPECT_TRUE(mapped.ok());
  EXPECT_EQ((*mapped)->bytes().size(), expected_size);
  return expect;
}

// The raw bytes of a value read by GgufFile, hex, as a list (one entry per
// array element).
std::vector<std::string> ReadBack(const GgufValue& v) {
  std::vector<std::string> out;
  auto one = [](const GgufValue& e) {
    return std::visit(
        [](const auto& x) -> std::string {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, absl::string_view>) {
            return Hex(x.data(), x.size());
          } else if constexpr (std::is_same_v<T, GgufArray>) {
            return "nested";
          } else if constexpr (std::is_same_v<T, bool>) {
            return x ? "01" : "00";
          } else {
            return Hex<T>(x);
          }
        },
        e.value);
  };
  if (const auto* a = std::get_if<GgufArray>(&v.value)) {
    for (size_t i = 0; i < a->size(); ++i) out.push_back(one(a->Get(i)));
  } else {
    out.push_back(one(v));
  }
  return out;
}

void CheckWithGgufFile(
    const std::string& path, const std::vector<TestTensor>& tensors,
    const std::map<std::string, std::vector<std::string>>& expect,
    uint32_t alignment) {
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ((*file)->alignment(), alignment);
  EXPECT_EQ((*file)->data_offset() % alignment, 0u);
  size_t extra = alignment != 32 ? 1 : 0;
  ASSERT_EQ((*file)->metadata().size(), expect.size() + extra);
  if (alignment != 32) {
    EXPECT_EQ((*file)->metadata()[0].first, "general.alignment");
  }
  for (const auto& [key, values] : expect) {
    const GgufValue* v = (*file)->Find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(ReadBack(*v), values) << key;
  }
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& info = (*file)->tensors()[i];
    EXPECT_EQ(info.name, tensors[i].name);
    EXPECT_EQ(info.dtype, tensors[i].dtype);
    EXPECT_EQ(info.shape, tensors[i].shape);
    EXPECT_EQ(info.offset % alignment, 0u);
    TensorView view = (*file)->View(info);
    ASSERT_EQ(view.nbytes, tensors[i].bytes.size());
    EXPECT_EQ(0, std::memcmp(view.data, tensors[i].bytes.data(), view.nbytes))
        << info.name;
  }
}

// Dumps every field and tensor as gguf.GGUFReader sees them: raw value
// bytes in hex, one entry per array element.
constexpr char kDumpScript[] = R"PY(
import json, sys
import numpy as np
from gguf import GGUFReader, GGUFValueType
r = GGUFReader(sys.argv[1])
fields = {}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    if f.types[0] == GGUFValueType.ARRAY:
        vals = [bytes(f.parts[i].tobytes()).hex() for i in f.data]
    else:
        vals = [bytes(f.parts[f.data[0]].tobytes()).hex()]
    fields[name] = {"types": [int(t) for t in f.types], "values": vals}
tensors = []
for t in r.tensors:
    tensors.append({"name": t.name, "type": int(t.tensor_type),
                    "ne": [int(x) for x in t.shape],
                    "offset": int(t.data_offset),
                    "data": np.asarray(t.data).tobytes().hex()})
print(json.dumps({"alignment": int(r.alignment), "fields": fields,
                  "tensors": tensors}))
)PY";

void CheckWithPython(
    const std::string& path, const std::vector<TestTensor>& tensors,
    const std::map<std::string, std::vector<std::string>>& expect,
    uint32_t alignment) {
  std::string python = testing::PythonPath();
  ASSERT_FALSE(python.empty())
      << "BATON_PYTHON is not set; run scripts/setup.sh";
  std::string script = TempPath("dump.py");
  std::ofstream(script) << kDumpScript;
  auto out = testing::RunCommand(absl::StrCat(python, " ", script, " ", path));
  std::remove(script.c_str());
  ASSERT_TRUE(out.ok()) << out.status()
                        << " (the venv needs numpy and gguf; run "
                           "scripts/setup.sh)";
  nlohmann::json j = nlohmann::json::parse(*out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << *out;
  EXPECT_EQ(j["alignment"].get<uint32_t>(), alignment);
  size_t extra = alignment != 32 ? 1 : 0;
  ASSERT_EQ(j["fields"].size(), expect.size() + extra);
  for (const auto& [key, values] : expect) {
    ASSERT_TRUE(j["fields"].contains(key)) << key;
    EXPECT_EQ(j["fields"][key]["values"].get<std::vector<std::string>>(),
              values)
        << key;
  }
  ASSERT_EQ(j["tensors"].size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = j["tensors"][i];
    EXPECT_EQ(t["name"].get<std::string>(), tensors[i].name);
    EXPECT_EQ(t["type"].get<uint32_t>(),
              static_cast<uint32_t>(tensors[i].dtype));
    std::vector<int64_t> ne(tensors[i].shape.rbegin(), tensors[i].shape.rend());
    EXPECT_EQ(t["ne"].get<std::vector<int64_t>>(), ne);
    EXPECT_EQ(t["offset"].get<uint64_t>() % alignment, 0u);
    EXPECT_EQ(t["data"].get<std::string>(),
              Hex(tensors[i].bytes.data(), tensors[i].bytes.size()))
        << tensors[i].name;
  }
}

TEST(GgufWriterTest, EveryTypeRoundTripsThroughGgufFileAndPython) {
  for (uint32_t alignment : {32u, 64u, 8u}) {
    SCOPED_TRACE(alignment);
    std::string path = TempPath(absl::StrCat("all_", alignment, ".gguf"));
    auto tensors = MakeTensors(alignment);
    auto expect = WriteTestFile(path, tensors, {.alignment = alignment}, 1);
    CheckWithGgufFile(path, tensors, expect, alignment);
    CheckWithPython(path, tensors, expect, alignment);
    std::remove(path.c_str());
  }
}

TEST(GgufWriterTest, PiecesGiveTheSameBytesAsWholeTensors) {
  auto tensors = MakeTensors(7);
  std::string whole = TempPath("whole.gguf");
  std::string pieces = TempPath("pieces.gguf");
  WriteTestFile(whole, tensors, {}, 1);
  // A tiny stdio buffer too, so pieces cross buffer boundaries.
  WriteTestFile(pieces, tensors, {.buffer_bytes = 5}, 3);
  auto a = MappedFile::Open(whole);
  auto b = MappedFile::Open(pieces);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->bytes().size(), (*b)->bytes().size());
  EXPECT_EQ(0, std::memcmp((*a)->bytes().data(), (*b)->bytes().data(),
                           (*a)->bytes().size()));
  std::remove(whole.c_str());
  std::remove(pieces.c_str());
}

// Rewriting the default model (written by the gguf package with alignment
// 32) from what GgufFile reads must reproduce it byte for byte.
TEST(GgufWriterTest, CopyOfDefaultModelIsByteIdentical) {
  std::string model = testing::DefaultModelPath();
  auto src = GgufFile::Open(model);
  ASSERT_TRUE(src.ok()) << src.status()
                        << " (the default model: run scripts/setup.sh)";
  std::string path = TempPath("copy.gguf");
  auto writer = GgufWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const auto& [key, value] : (*src)->metadata()) {
    ASSERT_TRUE((*writer)->AddValue(key, value).ok()) << key;
  }
  for (const GgufTensorInfo& t : (*src)->tensors()) {
    ASSERT_TRUE((*writer)->AddTensor(t.name, t.dtype, t.shape).ok());
  }
  for (const GgufTensorInfo& t : (*src)->tensors()) {
    TensorView v = (*src)->View(t);
    ASSERT_TRUE(
        (*writer)
            ->WriteTensorData(std::span<const uint8_t>(v.data, v.nbytes))
            .ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  auto a = MappedFile::Open(model);
  auto b = MappedFile::Open(path);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->bytes().size(), (*b)->bytes().size());
  EXPECT_EQ(0, std::memcmp((*a)->bytes().data(), (*b)->bytes().data(),
                           (*a)->bytes().size()));
  std::remove(path.c_str());
}

TEST(GgufWriterTest, NoTensorsIsAValidFile) {
  std::string path = TempPath("empty.gguf");
  auto writer = GgufWriter::Create(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->AddString("general.architecture", "llama").ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
  EXPECT_TRUE((*file)->tensors().empty());
  std::remove(path.c_str());
}

TEST(GgufWriterTest, RejectsMisuse) {
  EXPECT_EQ(
      GgufWriter::Create(TempPath("x"), {.alignment = 24}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufWriter::Create(TempPath("x"), {.alignment = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(GgufWriter::Create("/nonexistent-dir/x.gguf").ok());

  std::string path = TempPath("misuse.gguf");
  auto writer = GgufWriter::Create(path);
  ASSERT_TRUE(writer.ok());
  GgufWriter& w = **writer;
  ASSERT_TRUE(w.AddUint32("k", 1).ok());
  EXPECT_EQ(w.AddString("k", "again").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w.AddUint32("", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddUint32("general.alignment", 64).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> bad_row = {2, 33};
  absl::Status s = w.AddTensor("q", DType::kQ4_1, bad_row);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'q'"));
  EXPECT_EQ(w.AddTensor("s", DType::kF32, std::vector<int64_t>{}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      w.AddTensor("s", DType::kF32, std::vector<int64_t>{1, 1, 1, 1, 1}).code(),
      absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> shape = {4};
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, shape).ok());
  EXPECT_EQ(w.AddTensor("a", DType::kF32, shape).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(w.AddTensor("b", DType::kF32, shape).ok());

  std::vector<uint8_t> bytes(20, 1);
  s = w.WriteTensorData(bytes);  // 20 > 16 bytes of 'a'
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  ASSERT_TRUE(w.WriteTensorData(std::span(bytes.data(), 16)).ok());
  EXPECT_EQ(w.AddUint32("late", 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.AddTensor("late", DType::kF32, shape).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.WriteTensorData(std::span(bytes.data(), 8)).ok());
  s = w.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  ASSERT_TRUE(w.WriteTensorData(std::span(bytes.data(), 8)).ok());
  EXPECT_EQ(w.WriteTensorData(std::span(bytes.data(), 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w.Finish().ok());
  EXPECT_EQ(w.Finish().code(), absl::StatusCode::kFailedPrecondition);
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 2u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace baton
