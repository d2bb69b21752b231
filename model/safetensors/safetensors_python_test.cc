// Cross-checks the reader against files written by the official `safetensors`
// Python package (model/safetensors/testdata_writer.py).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "model/safetensors/safetensors_file.h"
#include "model/safetensors/safetensors_model.h"
#include "model/safetensors/safetensors_test_util.h"

namespace baton {
namespace {

using ::testing::ElementsAre;

// Runs testdata_writer.py into `out`; false (with a test failure) on error.
bool WriteReferenceFiles(const std::string& out) {
  const char* python = std::getenv("BATON_PYTHON");
  const char* source = std::getenv("BATON_SOURCE_DIR");
  if (python == nullptr || source == nullptr) {
    ADD_FAILURE() << "BATON_PYTHON and BATON_SOURCE_DIR must be set (ctest "
                     "sets them; scripts/setup.sh creates the venv)";
    return false;
  }
  std::string command =
      absl::StrCat("'", python, "' '", source,
                   "/model/safetensors/testdata_writer.py' '", out, "'");
  int rc = std::system(command.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "`" << command << "` failed with status " << rc
                  << "; is the venv with numpy and safetensors set up "
                     "(scripts/setup.sh)?";
    return false;
  }
  return true;
}

std::vector<float> ReadRawF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  EXPECT_TRUE(in.good() || in.eof()) << "cannot read " << path;
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);
  return values;
}

// The view's elements as float32, converting F16 / BF16 exactly.
std::vector<float> ToF32(const TensorView& view) {
  std::vector<float> out(static_cast<size_t>(view.NumElements()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (view.dtype == DType::kF32) {
      std::memcpy(&out[i], view.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, view.data + 2 * i, 2);
      out[i] = view.dtype == DType::kF16 ? F16ToF32(h) : BF16ToF32(h);
    }
  }
  return out;
}

// Bit patterns, so that -0 vs 0 and NaN payloads count.
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * 4);
  return bits;
}

void ExpectSameBits(const TensorView& view, const std::string& raw_path) {
  std::vector<float> expected = ReadRawF32(raw_path);
  ASSERT_EQ(view.NumElements(), static_cast<int64_t>(expected.size()))
      << view.name;
  EXPECT_EQ(Bits(ToF32(view)), Bits(expected)) << view.name;
}

TEST(SafetensorsPythonTest, ReadsTheOfficialWritersBitsExactly) {
  testing::TempDir temp;
  const std::string& dir = temp.path();
  ASSERT_TRUE(WriteReferenceFiles(dir));
  auto file = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& st = **file;
  ASSERT_NE(st.FindMetadata("writer"), nullptr);
  EXPECT_EQ(*st.FindMetadata("writer"), "baton-test");
  EXPECT_EQ(*st.FindMetadata("format"), "np");
  ASSERT_EQ(st.tensors().size(), 3u);

  struct Expected {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  for (const Expected& e :
       std::vector<Expected>{{"weight_f32", DType::kF32, {4, 5}},
                             {"weight_f16", DType::kF16, {3, 7}},
                             {"weight_bf16", DType::kBF16, {2, 3, 4}}}) {
    SCOPED_TRACE(e.name);
    auto view = st.GetTensor(e.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, e.dtype);
    EXPECT_EQ(view->shape, e.shape);
    ExpectSameBits(*view, absl::StrCat(dir, "/", e.name, ".f32"));
  }
}

TEST(SafetensorsPythonTest, ReadsAShardedModelFromTheOfficialWriter) {
  testing::TempDir temp;
  const std::string& dir = temp.path();
  ASSERT_TRUE(WriteReferenceFiles(dir));
  auto model = SafetensorsModel::Open(dir + "/sharded");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_shards(), 2u);
  std::vector<std::string> names;
  for (const auto& t : (*model)->tensors()) names.push_back(t.info->name);
  EXPECT_THAT(names,
              ElementsAre("layer.0.bias", "layer.0.weight", "layer.1.weight"));
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto view = (*model)->GetTensor(name);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectSameBits(*view, absl::StrCat(dir, "/sharded/", name, ".f32"));
  }
}

}  // namespace
}  // namespace baton
