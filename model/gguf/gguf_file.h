// GGUF (v2 and v3) reader: header, typed metadata, tensor infos, and tensor
// data served straight from a read-only mmap of the file.
//
// Every length, count and offset is checked against the bytes that remain
// before anything is allocated, so a hostile file can cost at most a small
// multiple of its own size in memory; errors name the problem and the byte
// offset where it was found.
#ifndef BATON_MODEL_GGUF_GGUF_FILE_H_
#define BATON_MODEL_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mapped_file.h"
#include "model/tensor.h"

namespace baton {

// GGUF metadata value types, numbered as in the file format.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
absl::string_view GgufTypeName(GgufType type);

struct GgufValue;

// An array value. Elements stay in the mapped file and are decoded on access;
// the only allocation is one offset per variable-size element, which is never
// more bytes than those elements take in the file.
class GgufArray {
 public:
  GgufType element_type() const { return element_type_; }
  size_t size() const { return count_; }
  // REQUIRES: i < size().
  GgufValue Get(size_t i) const;
  // REQUIRES: element_type() == kString and i < size().
  absl::string_view GetString(size_t i) const;

 private:
  friend class GgufParser;
  GgufType element_type_ = GgufType::kUint8;
  uint64_t count_ = 0;
  const uint8_t* data_ = nullptr;  // first element
  std::vector<uint64_t> offsets_;  // strings and arrays: offset from data_
  uint64_t total_bytes_ = 0;       // strings and arrays: bytes of all elements
};

// One metadata value. The variant's index equals the GgufType number. Strings
// point into the mapped file and live as long as the GgufFile.
struct GgufValue {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float,
               bool, absl::string_view, GgufArray, uint64_t, int64_t, double>
      value;

  GgufType type() const { return static_cast<GgufType>(value.index()); }
  // Any integer type (not bool) as int64; OutOfRange for a uint64 > 2^63-1.
  absl::StatusOr<int64_t> AsInt() const;
  // Any integer or float type as double.
  absl::StatusOr<double> AsFloat() const;
  // A short human-readable rendering (arrays are summarised).
  std::string DebugString() const;
};

struct GgufTensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // outermost first (reversed GGUF ne[])
  uint64_t offset;             // absolute byte offset in the file
  uint64_t nbytes;
};

class GgufFile {
 public:
  // Maps and parses `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(
      const std::string& path);
  // Parses bytes the caller keeps alive (for tests and fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(
      std::span<const uint8_t> bytes);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Metadata in file order (keys are unique).
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const {
    return metadata_;
  }
  const GgufValue* Find(absl::string_view key) const;

  // Typed getters: NotFound naming a missing key; InvalidArgument naming the
  // key, the expected and the actual type otherwise.
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // A missing key yields `fallback`; a present key of the wrong type is an
  // error.
  absl::StatusOr<int64_t> GetIntOr(absl::string_view key,
                                   int64_t fallback) const;
  absl::StatusOr<double> GetFloatOr(absl::string_view key,
                                    double fallback) const;
  absl::StatusOr<bool> GetBoolOr(absl::string_view key, bool fallback) const;
  absl::StatusOr<const GgufArray*> GetArray(absl::string_view key,
                                            GgufType element_type) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(absl::string_view name) const;
  // The tensor's bytes, inside the mapping.
  TensorView View(const GgufTensorInfo& info) const;
  absl::StatusOr<TensorView> GetTensor(absl::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  absl::Status ParseAll();

  std::unique_ptr<MappedFile> file_;  // null when parsing caller's bytes
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace baton

#endif  // BATON_MODEL_GGUF_GGUF_FILE_H_
