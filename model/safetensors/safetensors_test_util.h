// Builders for safetensors files in tests: the format is written byte by byte
// here, independent of the reader under test.
#ifndef BATON_MODEL_SAFETENSORS_SAFETENSORS_TEST_UTIL_H_
#define BATON_MODEL_SAFETENSORS_SAFETENSORS_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace baton::testing {

// [8-byte little-endian header.size()][header][data].
std::string RawSafetensors(absl::string_view header, absl::string_view data);

struct TestTensor {
  std::string name;
  std::string dtype;  // safetensors spelling, e.g. "F32"
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// A well-formed file: tensors' data packed in the given order, header keys in
// the given order, header padded with spaces to a multiple of 8 bytes (as the
// official writer does). `metadata` becomes "__metadata__" when non-empty.
std::string BuildSafetensors(
    const std::vector<TestTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {});

// Raw little-endian bytes of `values`.
std::string F32Bytes(const std::vector<float>& values);
std::string U16Bytes(const std::vector<uint16_t>& values);

// The element at p, which may be unaligned.
float LoadF32(const uint8_t* p);
uint16_t LoadU16(const uint8_t* p);

// A fresh empty directory under $TEST_TMPDIR or /tmp, removed with its
// contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};
// Writes `contents` to `path`, failing the test on error.
void WriteFile(const std::string& path, absl::string_view contents);

}  // namespace baton::testing

#endif  // BATON_MODEL_SAFETENSORS_SAFETENSORS_TEST_UTIL_H_
