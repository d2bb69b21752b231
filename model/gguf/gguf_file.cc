#include "model/gguf/gguf_file.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace baton {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kMinKvBytes = 8 + 4;  // empty key + type
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

bool IsKnownType(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kFloat64);
}

// Encoded size of a fixed-size value, 0 for strings and arrays.
uint64_t FixedSize(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes a fixed-size value at p. REQUIRES: FixedSize(type) > 0.
GgufValue DecodeFixed(GgufType type, const uint8_t* p) {
  switch (type) {
    case GgufType::kUint8:
      return {Load<uint8_t>(p)};
    case GgufType::kInt8:
      return {Load<int8_t>(p)};
    case GgufType::kUint16:
      return {Load<uint16_t>(p)};
    case GgufType::kInt16:
      return {Load<int16_t>(p)};
    case GgufType::kUint32:
      return {Load<uint32_t>(p)};
    case GgufType::kInt32:
      return {Load<int32_t>(p)};
    case GgufType::kFloat32:
      return {Load<float>(p)};
    case GgufType::kBool:
      return {*p != 0};
    case GgufType::kUint64:
      return {Load<uint64_t>(p)};
    case GgufType::kInt64:
      return {Load<int64_t>(p)};
    case GgufType::kFloat64:
      return {Load<double>(p)};
    default:
      break;
  }
  BATON_CHECK(false) << "DecodeFixed on variable-size GGUF type";
}

}  // namespace

// Bounds-checked cursor over the file; every error names the byte offset.
class GgufParser {
 public:
  explicit GgufParser(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  void set_pos(uint64_t pos) { pos_ = pos; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n > remaining()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF truncated: %s at offset %d needs %d bytes, %d remain", what,
          pos_, n, remaining()));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    BATON_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v = Load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<absl::string_view> ReadString(absl::string_view what) {
    uint64_t at = pos_;
    BATON_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF %s at offset %d has length %d, but only %d bytes remain", what,
          at, len, remaining()));
    }
    absl::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_),
                        len);
    pos_ += len;
    return s;
  }

  absl::StatusOr<GgufType> ReadType(absl::string_view what) {
    uint64_t at = pos_;
    BATON_ASSIGN_OR_RETURN(uint32_t t, Read<uint32_t>(what));
    if (!IsKnownType(t)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF %s at offset %d is unknown value type %d", what, at, t));
    }
    return static_cast<GgufType>(t);
  }

  absl::StatusOr<GgufValue> ReadValue(GgufType type, int depth,
                                      absl::string_view what) {
    if (uint64_t size = FixedSize(type); size > 0) {
      uint64_t at = pos_;
      BATON_RETURN_IF_ERROR(Need(size, what));
      GgufValue v = DecodeFixed(type, bytes_.data() + pos_);
      if (type == GgufType::kBool && bytes_[pos_] > 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GGUF %s at offset %d: bool has value %d", what, at, bytes_[pos_]));
      }
      pos_ += size;
      return v;
    }
    if (type == GgufType::kString) {
      BATON_ASSIGN_OR_RETURN(absl::string_view s, ReadString(what));
      return GgufValue{s};
    }
    BATON_ASSIGN_OR_RETURN(GgufArray array, ReadArray(depth, what));
    return GgufValue{std::move(array)};
  }

  absl::StatusOr<GgufArray> ReadArray(int depth, absl::string_view what) {
    uint64_t at = pos_;
    if (depth >= kMaxArrayDepth) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GGUF %s at offset %d: arrays nested deeper than %d",
                          what, at, kMaxArrayDepth));
    }
    GgufArray array;
    BATON_ASSIGN_OR_RETURN(array.element_type_, ReadType(what));
    BATON_ASSIGN_OR_RETURN(array.count_, Read<uint64_t>(what));
    uint64_t size = FixedSize(array.element_type_);
    // Smallest possible encoding of one element bounds the count.
    uint64_t min_size = size > 0                                   ? size
                        : array.element_type_ == GgufType::kString ? 8
                                                                   : 12;
    if (array.count_ > remaining() / min_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF %s at offset %d: array of %d %s elements needs at least %d "
          "bytes per element, but only %d bytes remain",
          what, at, array.count_, GgufTypeName(array.element_type_), min_size,
          remaining()));
    }
    array.data_ = bytes_.data() + pos_;
    if (size > 0) {
      if (array.element_type_ == GgufType::kBool) {
        for (uint64_t i = 0; i < array.count_; ++i) {
          if (bytes_[pos_ + i] > 1) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "GGUF %s at offset %d: bool element has value %d", what,
                pos_ + i, bytes_[pos_ + i]));
          }
        }
      }
      pos_ += array.count_ * size;
      return array;
    }
    uint64_t start = pos_;
    array.offsets_.reserve(array.count_);
    for (uint64_t i = 0; i < array.count_; ++i) {
      array.offsets_.push_back(pos_ - start);
      BATON_RETURN_IF_ERROR(
          ReadValue(array.element_type_, depth + 1, what).status());
    }
    array.total_bytes_ = pos_ - start;
    return array;
  }

  absl::Status ParseInto(GgufFile& file);

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

GgufValue GgufArray::Get(size_t i) const {
  BATON_CHECK_LT(i, count_);
  uint64_t size = FixedSize(element_type_);
  if (size > 0) return DecodeFixed(element_type_, data_ + i * size);
  if (element_type_ == GgufType::kString) return {GetString(i)};
  // Nested array: re-parse the element, which was validated at load.
  uint64_t end = i + 1 < count_ ? offsets_[i + 1] : total_bytes_;
  GgufParser parser(
      std::span<const uint8_t>(data_ + offsets_[i], end - offsets_[i]));
  auto nested = parser.ReadArray(1, "nested array");
  BATON_CHECK(nested.ok()) << nested.status();
  return {*std::move(nested)};
}

absl::Status GgufParser::ParseInto(GgufFile& file) {
  BATON_ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
  if (magic != kMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a GGUF file: bad magic 0x%08x at offset 0 (expected \"GGUF\")",
        magic));
  }
  BATON_ASSIGN_OR_RETURN(file.version_, Read<uint32_t>("version"));
  if (file.version_ == 1) {
    return absl::InvalidArgumentError(
        "GGUF version 1 at offset 4 is not supported (only 2 and 3)");
  }
  if (file.version_ != 2 && file.version_ != 3) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unsupported GGUF version %d at offset 4 (only 2 and 3; a "
        "big-endian file is not supported)",
        file.version_));
  }
  BATON_ASSIGN_OR_RETURN(uint64_t n_tensors, Read<uint64_t>("tensor count"));
  BATON_ASSIGN_OR_RETURN(uint64_t n_kv, Read<uint64_t>("metadata count"));
  if (n_kv > remaining() / kMinKvBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GGUF metadata count %d at offset 16 cannot fit in the %d bytes "
        "remaining",
        n_kv, remaining()));
  }
  file.metadata_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    uint64_t at = pos_;
    BATON_ASSIGN_OR_RETURN(absl::string_view key, ReadString("metadata key"));
    std::string what = absl::StrCat("metadata '", key, "'");
    BATON_ASSIGN_OR_RETURN(GgufType type, ReadType(what));
    BATON_ASSIGN_OR_RETURN(GgufValue value, ReadValue(type, 0, what));
    auto [it, inserted] =
        file.metadata_index_.emplace(std::string(key), file.metadata_.size());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF duplicate metadata key '%s' at offset %d", key, at));
    }
    file.metadata_.emplace_back(std::string(key), std::move(value));
  }
  if (const GgufValue* a = file.Find("general.alignment")) {
    if (a->type() != GgufType::kUint32) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF general.alignment must be uint32, got ",
                       GgufTypeName(a->type())));
    }
    uint32_t v = std::get<uint32_t>(a->value);
    if (v == 0 || (v & (v - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF general.alignment must be a power of two, got ", v));
    }
    file.alignment_ = v;
  }

  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GGUF tensor count %d at offset 8 cannot fit in the %d bytes "
        "remaining",
        n_tensors, remaining()));
  }
  file.tensors_.reserve(n_tensors);
  std::vector<uint64_t> relative_offsets;
  relative_offsets.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    uint64_t at = pos_;
    GgufTensorInfo info;
    BATON_ASSIGN_OR_RETURN(absl::string_view name, ReadString("tensor name"));
    info.name = std::string(name);
    std::string what = absl::StrCat("tensor '", info.name, "'");
    BATON_ASSIGN_OR_RETURN(uint32_t n_dims,
                           Read<uint32_t>(what + " dimension count"));
    if (n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GGUF %s at offset %d has %d dimensions (at most %d)",
                          what, at, n_dims, kMaxDims));
    }
    info.shape.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      BATON_ASSIGN_OR_RETURN(uint64_t ne, Read<uint64_t>(what + " dimension"));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GGUF %s at offset %d: dimension %d is %d", what, at, d, ne));
      }
      info.shape[n_dims - 1 - d] = static_cast<int64_t>(ne);
    }
    uint64_t type_at = pos_;
    BATON_ASSIGN_OR_RETURN(uint32_t type, Read<uint32_t>(what + " type"));
    const DTypeInfo* dtype = FindDTypeInfo(type);
    if (dtype == nullptr || dtype->internal) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GGUF %s at offset %d has unknown tensor type %d",
                          what, type_at, type));
    }
    info.dtype = dtype->dtype;
    BATON_ASSIGN_OR_RETURN(uint64_t offset, Read<uint64_t>(what + " offset"));
    if (offset % file.alignment_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF %s at offset %d: data offset %d is not a multiple of the "
          "alignment %d",
          what, at, offset, file.alignment_));
    }
    auto nbytes = TensorBytes(info.dtype, info.shape);
    if (!nbytes.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF %s at offset %d: %s", what, at, nbytes.status().message()));
    }
    info.nbytes = *nbytes;
    auto [it, inserted] =
        file.tensor_index_.emplace(info.name, file.tensors_.size());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF duplicate tensor name '%s' at offset %d", info.name, at));
    }
    relative_offsets.push_back(offset);
    file.tensors_.push_back(std::move(info));
  }

  uint64_t pad = (file.alignment_ - pos_ % file.alignment_) % file.alignment_;
  file.data_offset_ = pos_ + pad;
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    GgufTensorInfo& info = file.tensors_[i];
    uint64_t size = bytes_.size();
    if (file.data_offset_ > size || relative_offsets[i] > size ||
        info.nbytes > size ||
        file.data_offset_ + relative_offsets[i] > size - info.nbytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF tensor '%s' (%s %s, %d bytes at data offset %d) extends past "
          "the end of the %d-byte file",
          info.name, DTypeName(info.dtype), ShapeToString(info.shape),
          info.nbytes, relative_offsets[i], size));
    }
    info.offset = file.data_offset_ + relative_offsets[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(
    const std::string& path) {
  BATON_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = mapped->bytes();
  file->file_ = std::move(mapped);
  GgufParser parser(file->bytes_);
  if (absl::Status s = parser.ParseInto(*file); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(
    std::span<const uint8_t> bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  GgufParser parser(bytes);
  BATON_RETURN_IF_ERROR(parser.ParseInto(*file));
  return file;
}

}  // namespace baton
