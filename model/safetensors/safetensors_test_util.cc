#include "model/safetensors/safetensors_test_util.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace baton::testing {

std::string RawSafetensors(absl::string_view header, absl::string_view data) {
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  absl::StrAppend(&out, header, data);
  return out;
}

std::string BuildSafetensors(
    const std::vector<TestTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<std::string> entries;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) {
      kv.push_back(absl::StrCat("\"", k, "\":\"", v, "\""));
    }
    entries.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(kv, ","), "}"));
  }
  std::string data;
  for (const TestTensor& t : tensors) {
    size_t begin = data.size();
    data += t.data;
    entries.push_back(
        absl::StrCat("\"", t.name, "\":{\"dtype\":\"", t.dtype,
                     "\",\"shape\":[", absl::StrJoin(t.shape, ","),
                     "],\"data_offsets\":[", begin, ",", data.size(), "]}"));
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  while (header.size() % 8 != 0) header.push_back(' ');
  return RawSafetensors(header, data);
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string out(values.size() * 2, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  path_ = absl::StrCat(base != nullptr ? base : "/tmp", "/baton_st_XXXXXX");
  char* dir = mkdtemp(path_.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp " << path_ << ": " << strerror(errno);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

}  // namespace baton::testing
