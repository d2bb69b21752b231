// Reader for one Hugging Face `.safetensors` file:
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
//
// The header is a JSON object mapping each tensor name to
// {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}
// (offsets relative to the start of the data section) plus an optional
// "__metadata__" object of string -> string. Tensor bytes stay in a read-only
// mmap of the file.
//
// Every tensor entry is validated when the file is opened: dtype known to the
// safetensors format, shape of non-negative integers whose element and byte
// counts fit in int64, 0 <= begin <= end <= data section size, and
// end - begin == bytes of (dtype, shape). Duplicate JSON keys are rejected.
// Errors are InvalidArgument and name the file, the tensor and the problem.
//
// Tensors may overlap or leave gaps in the data section: both are harmless to
// a read-only reader, so neither is rejected (the official writer produces
// neither).
//
// Baton computes with F32, F16 and BF16. Tensors of other safetensors dtypes
// (BOOL, U8, I8, F8_*, I16, U16, I32, U32, I64, U64, F64, C64, F4, F6_*) are
// validated and listed like any other, and GetTensor()/View() report them as
// Unimplemented naming the dtype and the tensor.
//
// Tensor data is wherever the file puts it: the official writer pads the
// header so the data section starts 8-byte aligned, but a TensorView's data
// may be unaligned for files from other writers.
#ifndef BATON_MODEL_SAFETENSORS_SAFETENSORS_FILE_H_
#define BATON_MODEL_SAFETENSORS_SAFETENSORS_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mapped_file.h"
#include "model/tensor.h"

namespace baton {

struct SafetensorsTensorInfo {
  std::string name;
  // The file's spelling: "F32", "BF16", "I64", "F8_E4M3", ...
  absl::string_view dtype_name;
  // Set for F32 / F16 / BF16; empty for dtypes Baton does not compute with.
  std::optional<DType> dtype;
  std::vector<int64_t> shape;  // outermost first, as in the file; {} = scalar
  uint64_t offset = 0;         // absolute byte offset in the file
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  // Header length limit (the official implementation's is 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

  // Maps and parses `path`. Errors from mapping (NotFound, ...) pass through;
  // parse errors name `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  // Parses bytes the caller keeps alive for the SafetensorsFile's lifetime
  // (for tests and fuzzing).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(
      std::span<const uint8_t> bytes);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The mapped path; empty for Parse().
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint64_t header_size() const { return header_size_; }  // N
  uint64_t data_offset() const { return 8 + header_size_; }

  // "__metadata__" entries, sorted by key.
  const std::map<std::string, std::string, std::less<>>& metadata() const {
    return metadata_;
  }
  // nullptr when absent.
  const std::string* FindMetadata(absl::string_view key) const;

  // All tensors, sorted by name (byte-wise).
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensorInfo* FindTensor(absl::string_view name) const;
  // The tensor's bytes inside the mapping. Unimplemented for a dtype Baton
  // does not compute with. REQUIRES: info is one of tensors().
  absl::StatusOr<TensorView> View(const SafetensorsTensorInfo& info) const;
  // NotFound naming the tensor and the file, or View()'s result.
  absl::StatusOr<TensorView> GetTensor(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  absl::Status ParseAll();
  // "safetensors file 'path'" or "safetensors buffer".
  std::string Describe() const;

  std::unique_ptr<MappedFile> file_;  // null when parsing caller's bytes
  std::string path_;
  std::span<const uint8_t> bytes_;
  uint64_t header_size_ = 0;
  std::map<std::string, std::string, std::less<>> metadata_;
  std::vector<SafetensorsTensorInfo> tensors_;
};

}  // namespace baton

#endif  // BATON_MODEL_SAFETENSORS_SAFETENSORS_FILE_H_
