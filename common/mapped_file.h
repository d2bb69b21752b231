// A read-only memory mapping of a whole file. Model weights are read through
// this so a multi-GB file costs page cache, not heap.
#ifndef BATON_COMMON_MAPPED_FILE_H_
#define BATON_COMMON_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound / PermissionDenied / InvalidArgument (a
  // directory) name the path. An empty file maps to an empty span.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace baton

#endif  // BATON_COMMON_MAPPED_FILE_H_
