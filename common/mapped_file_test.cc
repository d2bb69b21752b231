#include "common/mapped_file.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

TEST(MappedFileTest, MapsContents) {
  std::string path = TempPath("mapped_file_test.bin");
  std::ofstream(path, std::ios::binary) << "hello baton";
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 11u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->data()), 11),
            "hello baton");
  std::remove(path.c_str());
}

TEST(MappedFileTest, EmptyFileIsEmptySpan) {
  std::string path = TempPath("mapped_file_empty.bin");
  std::ofstream(path, std::ios::binary).close();
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_TRUE((*file)->bytes().empty());
  std::remove(path.c_str());
}

TEST(MappedFileTest, MissingFileIsNotFoundNamingPath) {
  auto file = MappedFile::Open("/nonexistent/baton/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/baton/model.gguf"),
            std::string::npos);
}

TEST(MappedFileTest, DirectoryIsInvalidArgument) {
  auto file = MappedFile::Open(::testing::TempDir());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
