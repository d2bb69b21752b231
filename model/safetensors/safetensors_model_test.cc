#include "model/safetensors/safetensors_model.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors/safetensors_test_util.h"

namespace baton {
namespace {

using ::baton::testing::BuildSafetensors;
using ::baton::testing::F32Bytes;
using ::baton::testing::TempDir;
using ::baton::testing::U16Bytes;
using ::baton::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

std::string Index(absl::string_view weight_map) {
  return absl::StrCat(R"({"metadata":{"total_size":40},"weight_map":{)",
                      weight_map, "}}");
}

// Two shards: kShard1 = {b.weight F32 [2], a.weight F32 [3]},
// kShard2 = {c.weight BF16 [2], d.ids I32 [1]}.
void MakeShardedDir(const std::string& dir, absl::string_view index_json) {
  WriteFile(dir + "/" + kShard1,
            BuildSafetensors({{"b.weight", "F32", {2}, F32Bytes({1, 2})},
                              {"a.weight", "F32", {3}, F32Bytes({3, 4, 5})}}));
  WriteFile(
      dir + "/" + kShard2,
      BuildSafetensors({{"c.weight", "BF16", {2}, U16Bytes({0x3f80, 0x4000})},
                        {"d.ids", "I32", {1}, std::string(4, '\0')}}));
  WriteFile(dir + "/model.safetensors.index.json", index_json);
}

std::string GoodWeightMap() {
  return absl::StrCat(R"("a.weight":")", kShard1, R"(","b.weight":")", kShard1,
                      R"(","c.weight":")", kShard2, R"(","d.ids":")", kShard2,
                      R"(")");
}

TEST(SafetensorsModelTest, OpensASingleFileDirectoryOrFile) {
  TempDir temp;
  const std::string& dir = temp.path();
  std::string path = dir + "/model.safetensors";
  WriteFile(path, BuildSafetensors({{"w", "F32", {2}, F32Bytes({7, 8})}}));
  for (const std::string& open_path : {dir, path}) {
    SCOPED_TRACE(open_path);
    auto model = SafetensorsModel::Open(open_path);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->directory(), dir);
    EXPECT_EQ((*model)->config_json_path(), dir + "/config.json");
    EXPECT_TRUE((*model)->index_path().empty());
    EXPECT_EQ((*model)->num_shards(), 1u);
    auto w = (*model)->GetTensor("w");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(testing::LoadF32(w->data + 4 * 1), 8.0f);
  }
}

TEST(SafetensorsModelTest, OpensAShardedDirectoryOrIndex) {
  TempDir temp;
  const std::string& dir = temp.path();
  MakeShardedDir(dir, Index(GoodWeightMap()));
  for (const std::string& open_path :
       {dir, dir + "/model.safetensors.index.json"}) {
    SCOPED_TRACE(open_path);
    auto model = SafetensorsModel::Open(open_path);
    ASSERT_TRUE(model.ok()) << model.status();
    const SafetensorsModel& m = **model;
    EXPECT_EQ(m.directory(), dir);
    EXPECT_EQ(m.config_json_path(), dir + "/config.json");
    EXPECT_EQ(m.index_path(), dir + "/model.safetensors.index.json");
    ASSERT_EQ(m.num_shards(), 2u);
    EXPECT_EQ(m.shard(0).path(), dir + "/" + kShard1);
    EXPECT_EQ(m.shard(1).path(), dir + "/" + kShard2);

    std::vector<std::string> names;
    std::vector<size_t> shards;
    for (const SafetensorsModelTensor& t : m.tensors()) {
      names.push_back(t.info->name);
      shards.push_back(t.shard);
    }
    EXPECT_THAT(names,
                ElementsAre("a.weight", "b.weight", "c.weight", "d.ids"));
    EXPECT_THAT(shards, ElementsAre(0, 0, 1, 1));

    auto a = m.GetTensor("a.weight");
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(a->shape, ElementsAre(3));
    EXPECT_EQ(testing::LoadF32(a->data + 4 * 2), 5.0f);
    auto c = m.GetTensor("c.weight");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->dtype, DType::kBF16);
    EXPECT_EQ(testing::LoadU16(c->data + 2 * 1), 0x4000);

    auto ids = m.GetTensor("d.ids");
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(ids.status().message(), HasSubstr("I32"));
    auto missing = m.GetTensor("e");
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(missing.status().message(), HasSubstr("'e'"));
  }
}

struct BadIndexCase {
  std::string label;
  std::string index;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

TEST(SafetensorsModelTest, RejectsEachInconsistentIndex) {
  const std::string good = GoodWeightMap();
  std::vector<BadIndexCase> cases = {
      {"missing shard",
       Index(good + R"(,"e.weight":"model-00003-of-00003.safetensors")"),
       absl::StatusCode::kNotFound,
       {"model-00003-of-00003.safetensors", "weight_map"}},
      {"tensor absent from its shard",
       Index(good + absl::StrCat(R"(,"e.weight":")", kShard1, R"(")")),
       absl::StatusCode::kInvalidArgument,
       {"tensor 'e.weight'", kShard1, "no such tensor"}},
      {"tensor in another shard",
       Index(absl::StrCat(R"("a.weight":")", kShard2, R"(","b.weight":")",
                          kShard1, R"(","c.weight":")", kShard2,
                          R"(","d.ids":")", kShard2, R"(")")),
       absl::StatusCode::kInvalidArgument,
       {"tensor 'a.weight'", "no such tensor", "it is in shard"}},
      {"shard tensor not listed",
       Index(absl::StrCat(R"("a.weight":")", kShard1, R"(","c.weight":")",
                          kShard2, R"(","d.ids":")", kShard2, R"(")")),
       absl::StatusCode::kInvalidArgument,
       {"tensor 'b.weight'", "not listed in weight_map"}},
      {"shard with slash",
       Index(good + R"(,"e":"sub/x.safetensors")"),
       absl::StatusCode::kInvalidArgument,
       {"\"sub/x.safetensors\"", "tensor 'e'", "path separator"}},
      {"shard with dotdot",
       Index(good + R"(,"e":"..x.safetensors")"),
       absl::StatusCode::kInvalidArgument,
       {"\"..x.safetensors\"", "contains \"..\""}},
      {"shard escaping",
       Index(good + R"(,"e":"../model.safetensors")"),
       absl::StatusCode::kInvalidArgument,
       {"../model.safetensors"}},
      {"empty shard name",
       Index(good + R"(,"e":"")"),
       absl::StatusCode::kInvalidArgument,
       {"is empty"}},
      {"shard not string",
       Index(good + R"(,"e":3)"),
       absl::StatusCode::kInvalidArgument,
       {"tensor 'e'", "must be a JSON string, got a JSON integer"}},
      {"duplicate weight_map key",
       Index(good + absl::StrCat(R"(,"a.weight":")", kShard2, R"(")")),
       absl::StatusCode::kInvalidArgument,
       {"duplicate key \"a.weight\"", "/weight_map"}},
      {"missing weight_map",
       R"({"metadata":{}})",
       absl::StatusCode::kInvalidArgument,
       {"missing \"weight_map\""}},
      {"weight_map not object",
       R"({"weight_map":[]})",
       absl::StatusCode::kInvalidArgument,
       {"\"weight_map\" must be a JSON object"}},
      {"metadata not object",
       absl::StrCat(R"({"metadata":1,"weight_map":{)", good, "}}"),
       absl::StatusCode::kInvalidArgument,
       {"\"metadata\" must be a JSON object"}},
      {"malformed",
       "{\"weight_map\": {",
       absl::StatusCode::kInvalidArgument,
       {"malformed JSON at byte offset 16"}},
  };
  for (const BadIndexCase& c : cases) {
    SCOPED_TRACE(c.label);
    TempDir temp;
    const std::string& dir = temp.path();
    MakeShardedDir(dir, c.index);
    auto model = SafetensorsModel::Open(dir);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), c.code) << model.status();
    EXPECT_THAT(model.status().message(),
                HasSubstr("model.safetensors.index.json"));
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(model.status().message(), HasSubstr(part));
    }
  }
}

TEST(SafetensorsModelTest, RejectsATensorInTwoShards) {
  TempDir temp;
  const std::string& dir = temp.path();
  MakeShardedDir(dir, Index(GoodWeightMap()));
  // Shard 2 also holds a.weight.
  WriteFile(dir + "/" + kShard2,
            BuildSafetensors({{"c.weight", "BF16", {2}, U16Bytes({1, 2})},
                              {"a.weight", "F32", {1}, F32Bytes({1})},
                              {"d.ids", "I32", {1}, std::string(4, '\0')}}));
  auto model = SafetensorsModel::Open(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr(absl::StrCat("tensor 'a.weight' is in both shard '",
                                     kShard1, "' and shard '", kShard2, "'")));
}

TEST(SafetensorsModelTest, ReportsBrokenShardsAndMissingFiles) {
  TempDir temp;
  const std::string& dir = temp.path();
  MakeShardedDir(dir, Index(GoodWeightMap()));
  WriteFile(dir + "/" + kShard2, "short");
  auto model = SafetensorsModel::Open(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr(kShard2));
  EXPECT_THAT(model.status().message(), HasSubstr("shorter than"));

  TempDir empty_dir;
  const std::string& empty = empty_dir.path();
  auto none = SafetensorsModel::Open(empty);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(),
              HasSubstr("neither model.safetensors nor "
                        "model.safetensors.index.json"));
  EXPECT_EQ(SafetensorsModel::Open(empty + "/nope.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace baton
