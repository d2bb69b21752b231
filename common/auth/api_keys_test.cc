#include "common/auth/api_keys.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/testing/test_pki.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::WriteFileAtomically;

class ApiKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = baton::testing::TempDir::Create("baton-api-keys-test");
    ASSERT_TRUE(dir.ok());
    temp_dir_ = std::move(*dir);
    dir_ = temp_dir_.path();
    path_ = dir_ + "/keys";
  }
  baton::testing::TempDir temp_dir_;  // removed with the fixture
  std::string dir_, path_;
};

TEST_F(ApiKeysTest, AcceptsTheFilesKeysAndNothingElse) {
  ASSERT_TRUE(
      WriteFileAtomically(path_, "# team a\nsk-alpha\n\n  sk-beta  \n").ok());
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->size(), 2u);
  EXPECT_TRUE((*keys)->Check("Bearer sk-alpha").ok());
  EXPECT_TRUE((*keys)->Check("bearer sk-beta").ok());
  EXPECT_TRUE((*keys)->Check(BearerValue((*keys)->process_key())).ok());
  for (const char* bad :
       {"", "Bearer", "Bearer ", "sk-alpha", "Basic sk-alpha", "Bearer sk-alph",
        "Bearer # team a", "Bearer sk-alpha2"}) {
    const absl::Status s = (*keys)->Check(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(s.message().find("sk-"), std::string::npos) << s;
  }
}

TEST_F(ApiKeysTest, ReloadsWhenTheFileChangesAndKeepsKeysOnABadRewrite) {
  ASSERT_TRUE(WriteFileAtomically(path_, "old-key\n").ok());
  auto keys = ApiKeys::Load(path_, absl::ZeroDuration());
  ASSERT_TRUE(keys.ok());
  ASSERT_TRUE((*keys)->Check("Bearer old-key").ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "new-key\n").ok());
  EXPECT_TRUE((*keys)->Check("Bearer new-key").ok());
  EXPECT_EQ((*keys)->Check("Bearer old-key").code(),
            absl::StatusCode::kUnauthenticated);
  // An empty rewrite (a half-done edit) keeps the last good keys.
  ASSERT_TRUE(WriteFileAtomically(path_, "\n# nothing yet\n").ok());
  EXPECT_TRUE((*keys)->Check("Bearer new-key").ok());
}

TEST_F(ApiKeysTest, MissingOrEmptyFileIsALoadErrorNamingTheFlag) {
  auto missing = ApiKeys::Load(path_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--api_keys_file"),
            std::string::npos);
  ASSERT_TRUE(WriteFileAtomically(path_, "# only a comment\n").ok());
  auto empty = ApiKeys::Load(path_);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no key"), std::string::npos);
}

}  // namespace
}  // namespace baton
