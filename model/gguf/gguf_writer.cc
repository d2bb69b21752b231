#include "model/gguf/gguf_writer.h"

#include <cerrno>
#include <cstring>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace baton {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kMaxAlignment = 1u << 20;
constexpr size_t kMaxDims = 4;  // GGML_MAX_DIMS

uint64_t PadTo(uint64_t n, uint64_t alignment) {
  return (alignment - n % alignment) % alignment;
}

template <typename T>
void AppendPod(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void AppendString(std::string& out, absl::string_view s) {
  AppendPod<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

}  // namespace

GgufWriter::GgufWriter(std::FILE* file, std::string path,
                       const GgufWriterOptions& options)
    : file_(file), path_(std::move(path)), options_(options) {}

GgufWriter::~GgufWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<std::unique_ptr<GgufWriter>> GgufWriter::Create(
    const std::string& path, const GgufWriterOptions& options) {
  uint32_t a = options.alignment;
  if (a == 0 || (a & (a - 1)) != 0 || a > kMaxAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF alignment must be a power of two in [1, ",
                     kMaxAlignment, "], got ", a));
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return ErrnoStatus(errno, "cannot create", path);
  std::unique_ptr<GgufWriter> writer(new GgufWriter(file, path, options));
  if (options.buffer_bytes > 0) {
    writer->buffer_.resize(options.buffer_bytes);
    std::setvbuf(file, writer->buffer_.data(), _IOFBF, writer->buffer_.size());
  }
  if (a != 32) {
    writer->keys_.insert("general.alignment");
    AppendString(writer->kv_bytes_, "general.alignment");
    AppendPod<uint32_t>(writer->kv_bytes_,
                        static_cast<uint32_t>(GgufType::kUint32));
    AppendPod<uint32_t>(writer->kv_bytes_, a);
    ++writer->num_kv_;
  }
  return writer;
}

absl::Status GgufWriter::CheckKey(absl::string_view key) {
  if (header_written_ || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GGUF metadata '", key, "' added after tensor data started"));
  }
  if (key.empty()) {
    return absl::InvalidArgumentError("GGUF metadata key must not be empty");
  }
  if (key == "general.alignment") {
    return absl::InvalidArgumentError(
        "GGUF general.alignment is written from GgufWriterOptions::alignment");
  }
  if (!keys_.emplace(key).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("GGUF metadata key '", key, "' added twice"));
  }
  AppendString(kv_bytes_, key);
  ++num_kv_;
  return absl::OkStatus();
}

absl::Status GgufWriter::AddScalar(absl::string_view key, GgufType type,
                                   const void* value, size_t size) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  kv_bytes_.append(static_cast<const char*>(value), size);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddScalarArray(absl::string_view key, GgufType type,
                                        const void* values, size_t count,
                                        size_t size) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kArray));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  AppendPod<uint64_t>(kv_bytes_, count);
  if (count > 0)
    kv_bytes_.append(static_cast<const char*>(values), count * size);
  return absl::OkStatus();
}

#define BATON_GGUF_SCALAR(Method, CType, Type)                               \
  absl::Status GgufWriter::Method(absl::string_view key, CType value) {      \
    return AddScalar(key, GgufType::Type, &value, sizeof(value));            \
  }                                                                          \
  absl::Status GgufWriter::AddArray(absl::string_view key,                   \
                                    std::span<const CType> values) {         \
    return AddScalarArray(key, GgufType::Type, values.data(), values.size(), \
                          sizeof(CType));                                    \
  }
BATON_GGUF_SCALAR(AddUint8, uint8_t, kUint8)
BATON_GGUF_SCALAR(AddInt8, int8_t, kInt8)
BATON_GGUF_SCALAR(AddUint16, uint16_t, kUint16)
BATON_GGUF_SCALAR(AddInt16, int16_t, kInt16)
BATON_GGUF_SCALAR(AddUint32, uint32_t, kUint32)
BATON_GGUF_SCALAR(AddInt32, int32_t, kInt32)
BATON_GGUF_SCALAR(AddFloat32, float, kFloat32)
BATON_GGUF_SCALAR(AddUint64, uint64_t, kUint64)
BATON_GGUF_SCALAR(AddInt64, int64_t, kInt64)
BATON_GGUF_SCALAR(AddFloat64, double, kFloat64)
#undef BATON_GGUF_SCALAR

absl::Status GgufWriter::AddBool(absl::string_view key, bool value) {
  uint8_t byte = value ? 1 : 0;
  return AddScalar(key, GgufType::kBool, &byte, 1);
}

absl::Status GgufWriter::AddBoolArray(absl::string_view key,
                                      std::span<const bool> values) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kArray));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kBool));
  AppendPod<uint64_t>(kv_bytes_, values.size());
  for (bool b : values) kv_bytes_.push_back(b ? 1 : 0);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddString(absl::string_view key,
                                   absl::string_view value) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kString));
  AppendString(kv_bytes_, value);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddStringArray(absl::string_view key,
                                        std::span<const std::string> values) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kArray));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kString));
  AppendPod<uint64_t>(kv_bytes_, values.size());
  for (const std::string& s : values) AppendString(kv_bytes_, s);
  return absl::OkStatus();
}

// Appends the value's bytes without its type tag.
void GgufWriter::AppendValue(const GgufValue& value) {
  std::visit(
      [this](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, absl::string_view>) {
          AppendString(kv_bytes_, v);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          AppendPod<uint32_t>(kv_bytes_,
                              static_cast<uint32_t>(v.element_type()));
          AppendPod<uint64_t>(kv_bytes_, v.size());
          for (size_t i = 0; i < v.size(); ++i) AppendValue(v.Get(i));
        } else if constexpr (std::is_same_v<T, bool>) {
          kv_bytes_.push_back(v ? 1 : 0);
        } else {
          AppendPod<T>(kv_bytes_, v);
        }
      },
      value.value);
}

absl::Status GgufWriter::AddValue(absl::string_view key,
                                  const GgufValue& value) {
  BATON_RETURN_IF_ERROR(CheckKey(key));
  AppendPod<uint32_t>(kv_bytes_, static_cast<uint32_t>(value.type()));
  AppendValue(value);
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(absl::string_view name, DType dtype,
                                   std::span<const int64_t> shape) {
  if (header_written_ || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GGUF tensor '", name, "' added after tensor data started"));
  }
  if (shape.empty() || shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GGUF tensor '%s' has %d dimensions, must have 1 to %d",
                        name, shape.size(), kMaxDims));
  }
  auto nbytes = TensorBytes(dtype, shape);
  if (!nbytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor '", name, "': ", nbytes.status().message()));
  }
  if (tensor_names_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("GGUF tensor '", name, "' added twice"));
  }
  tensor_names_.emplace(name);
  tensors_.push_back(TensorEntry{
      std::string(name), dtype,
      std::vector<int64_t>(shape.begin(), shape.end()), data_bytes_, *nbytes});
  data_bytes_ += *nbytes + PadTo(*nbytes, options_.alignment);
  return absl::OkStatus();
}

uint64_t GgufWriter::HeaderBytes() const {
  if (header_written_) return header_bytes_;
  uint64_t n = 4 + 4 + 8 + 8 + kv_bytes_.size();
  for (const TensorEntry& t : tensors_) {
    n += 8 + t.name.size() + 4 + 8 * t.shape.size() + 4 + 8;
  }
  return n + PadTo(n, options_.alignment);
}

uint64_t GgufWriter::ExpectedFileSize() const {
  return HeaderBytes() + data_bytes_;
}

absl::Status GgufWriter::WriteBytes(const void* data, size_t size) {
  if (size == 0) return absl::OkStatus();
  if (std::fwrite(data, 1, size, file_) != size) {
    return ErrnoStatus(errno, "cannot write", path_);
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteZeros(uint64_t count) {
  static constexpr char kZeros[64] = {};
  while (count > 0) {
    size_t n = count < sizeof(kZeros) ? count : sizeof(kZeros);
    BATON_RETURN_IF_ERROR(WriteBytes(kZeros, n));
    count -= n;
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteHeader() {
  std::string head;
  AppendPod<uint32_t>(head, kGgufMagic);
  AppendPod<uint32_t>(head, kGgufVersion);
  AppendPod<uint64_t>(head, tensors_.size());
  AppendPod<uint64_t>(head, num_kv_);
  head += kv_bytes_;
  for (const TensorEntry& t : tensors_) {
    AppendString(head, t.name);
    AppendPod<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) {
      AppendPod<uint64_t>(head, static_cast<uint64_t>(t.shape[d]));
    }
    AppendPod<uint32_t>(head, static_cast<uint32_t>(t.dtype));
    AppendPod<uint64_t>(head, t.offset);
  }
  head.append(PadTo(head.size(), options_.alignment), '\0');
  header_written_ = true;
  header_bytes_ = head.size();
  kv_bytes_.clear();
  kv_bytes_.shrink_to_fit();
  BATON_RETURN_IF_ERROR(WriteBytes(head.data(), head.size()));
  while (current_ < tensors_.size() && tensors_[current_].nbytes == 0) {
    ++current_;
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteTensorData(std::span<const uint8_t> bytes) {
  if (finished_) {
    return absl::FailedPreconditionError("GGUF writer already finished");
  }
  if (!header_written_) BATON_RETURN_IF_ERROR(WriteHeader());
  if (current_ >= tensors_.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GGUF tensor data of %d bytes written after all %d tensors were "
        "complete",
        bytes.size(), tensors_.size()));
  }
  const TensorEntry& t = tensors_[current_];
  uint64_t left = t.nbytes - current_done_;
  if (bytes.size() > left) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GGUF tensor '%s' has %d bytes left, got a piece of %d bytes", t.name,
        left, bytes.size()));
  }
  BATON_RETURN_IF_ERROR(WriteBytes(bytes.data(), bytes.size()));
  current_done_ += bytes.size();
  if (current_done_ == t.nbytes) {
    BATON_RETURN_IF_ERROR(WriteZeros(PadTo(t.nbytes, options_.alignment)));
    current_done_ = 0;
    ++current_;
    while (current_ < tensors_.size() && tensors_[current_].nbytes == 0) {
      ++current_;
    }
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError("GGUF writer already finished");
  }
  if (!header_written_) BATON_RETURN_IF_ERROR(WriteHeader());
  if (current_ < tensors_.size()) {
    const TensorEntry& t = tensors_[current_];
    return absl::FailedPreconditionError(absl::StrFormat(
        "GGUF tensor '%s' (%d of %d) has %d of its %d bytes", t.name,
        current_ + 1, tensors_.size(), current_done_, t.nbytes));
  }
  finished_ = true;
  std::FILE* file = std::exchange(file_, nullptr);
  if (std::fflush(file) != 0) {
    int err = errno;
    std::fclose(file);
    return ErrnoStatus(err, "cannot write", path_);
  }
  if (std::fclose(file) != 0) return ErrnoStatus(errno, "cannot close", path_);
  return absl::OkStatus();
}

}  // namespace baton
