// Compares FromHfJson tokenizers with HF tokenizers, live: runs
// scripts/reference/tokenizer_hf_reference.py, which builds tokenizer.json
// files from the default model's vocabulary (several pre-tokenizer variants)
// and prints HF's ids for every valid-UTF-8 corpus string.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_file.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_testing.h"
#include "model/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

struct Reference {
  std::vector<int32_t> ids;
  std::string decoded;
};

class HfReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto python = tokenizer_testing::RequireEnv("BATON_PYTHON");
    auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
    auto root = tokenizer_testing::RequireEnv("BATON_SOURCE_DIR");
    if (!python.ok() || !model.ok() || !root.ok()) {
      setup_error_ =
          "BATON_PYTHON, BATON_DEFAULT_MODEL and BATON_SOURCE_DIR "
          "must be set (run through ctest after scripts/setup.sh)";
      return;
    }
    char dir_template[] = "/tmp/baton_tokenizer_hf_XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      setup_error_ = "mkdtemp failed";
      return;
    }
    out_dir_ = dir_template;
    const std::string cmd = absl::StrCat(
        "'", *python, "' '", *root,
        "/scripts/reference/tokenizer_hf_reference.py'", " --gguf '", *model,
        "' --corpus '", *root,
        "/tests/data/tokenizer/corpus.jsonl' --out-dir '", out_dir_, "'");
    auto out = tokenizer_testing::RunCommand(cmd);
    if (!out.ok()) {
      setup_error_ = absl::StrCat(
          "the HF reference script failed (is the venv's `tokenizers` "
          "installed? scripts/setup.sh): ",
          out.status().ToString());
      return;
    }
    std::istringstream lines(*out);
    std::string line;
    while (std::getline(lines, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        setup_error_ = absl::StrCat("bad reference line: ", line);
        return;
      }
      (*refs_)[j["variant"].get<std::string>()][j["name"].get<std::string>()] =
          {j["ids"].get<std::vector<int32_t>>(),
           j["decoded"].get<std::string>()};
    }
  }

  static void TearDownTestSuite() {
    if (!out_dir_.empty()) std::filesystem::remove_all(out_dir_);
  }

  void CompareVariant(const std::string& variant) {
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    auto tok = Tokenizer::FromHfJson(
        absl::StrCat(out_dir_, "/", variant, "/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto corpus = tokenizer_testing::LoadCorpus();
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    const auto& refs = (*refs_)[variant];
    int compared = 0;
    for (const auto& e : *corpus) {
      if (!e.utf8) continue;  // HF takes only valid UTF-8
      auto it = refs.find(e.name);
      ASSERT_NE(it, refs.end()) << variant << ": no reference for " << e.name;
      const std::vector<int32_t> ids = (*tok)->Encode(e.bytes);
      EXPECT_EQ(ids, it->second.ids)
          << variant << " " << e.name << " text='" << absl::CHexEscape(e.bytes)
          << "'\n got  " << absl::StrJoin(ids, ",") << "\n want "
          << absl::StrJoin(it->second.ids, ",");
      // HF's ByteLevel decoder returns lossy UTF-8; Decode returns bytes.
      std::string decoded;
      utf8::AppendSanitized((*tok)->Decode(it->second.ids),
                            /*keep_incomplete_tail=*/false, &decoded);
      EXPECT_EQ(decoded, it->second.decoded) << variant << " " << e.name;
      ++compared;
    }
    EXPECT_GE(compared, 150);
    std::printf("%s: compared %d strings with HF tokenizers\n", variant.c_str(),
                compared);
  }

  static std::string setup_error_;
  static std::string out_dir_;
  static std::map<std::string, std::map<std::string, Reference>>* refs_;
};

std::string HfReferenceTest::setup_error_;
std::string HfReferenceTest::out_dir_;
std::map<std::string, std::map<std::string, Reference>>*
    HfReferenceTest::refs_ =
        new std::map<std::string, std::map<std::string, Reference>>();

TEST_F(HfReferenceTest, SmolLmPreTokenizer) { CompareVariant("smollm"); }
TEST_F(HfReferenceTest, Llama3SplitWithIgnoreMerges) {
  CompareVariant("llama3_split");
}
TEST_F(HfReferenceTest, Qwen2Split) { CompareVariant("qwen2_split"); }
TEST_F(HfReferenceTest, RemovedBehavior) { CompareVariant("removed_ws"); }

TEST_F(HfReferenceTest, ConfigBesideTokenizerJson) {
  ASSERT_TRUE(setup_error_.empty()) << setup_error_;
  auto tok =
      Tokenizer::FromHfJson(absl::StrCat(out_dir_, "/smollm/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ((*tok)->eos_id(), std::optional<int32_t>(2));
  EXPECT_FALSE((*tok)->add_bos_default());
  EXPECT_THAT(
      (*tok)->chat_template_source(),
      ::testing::HasSubstr("You are a helpful AI assistant named SmolLM"));
  EXPECT_TRUE((*tok)->IsSpecial(1));
  EXPECT_TRUE((*tok)->IsEndOfGeneration(2));

  // Same ids as the GGUF tokenizer on text with special tokens.
  auto model = tokenizer_testing::RequireEnv("BATON_DEFAULT_MODEL");
  ASSERT_TRUE(model.ok()) << model.status();
  auto gguf = GgufFile::Open(*model);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto from_gguf = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  const std::string text =
      "<|im_start|>user\nHow many r's in 12345?<|im_end|>\n";
  EXPECT_EQ((*tok)->Encode(text), (*from_gguf)->Encode(text));
}

}  // namespace
}  // namespace baton
