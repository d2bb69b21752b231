// GGUF v3 writer: typed metadata, tensor infos, and tensor data streamed to
// the file in pieces, so a file far larger than memory can be written while
// holding only the piece at hand.
//
// Usage (the phases are enforced):
//   1. Add*() metadata and AddTensor() infos, in file order.
//   2. WriteTensorData() the bytes of every tensor, in AddTensor() order; a
//      tensor may arrive in any number of pieces. The header is written
//      before the first piece.
//   3. Finish(): checks every tensor is complete, flushes and closes.
//
// Layout: header, metadata, tensor infos, zero padding to the alignment, then
// each tensor's bytes followed by zero padding to the alignment (the last
// tensor included), as the gguf Python package writes it.
#ifndef BATON_MODEL_GGUF_GGUF_WRITER_H_
#define BATON_MODEL_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/gguf/gguf_file.h"
#include "model/tensor.h"

namespace baton {

struct GgufWriterOptions {
  // Byte alignment of the data section and of every tensor (a power of two,
  // at most 1 MiB). A value other than 32 is recorded as the first metadata
  // key, general.alignment (uint32).
  uint32_t alignment = 32;
  // Bytes buffered before a write system call.
  size_t buffer_bytes = 4 << 20;
};

class GgufWriter {
 public:
  // Creates (truncates) `path`. InvalidArgument for a bad alignment; the
  // errno-derived code if the file cannot be created.
  static absl::StatusOr<std::unique_ptr<GgufWriter>> Create(
      const std::string& path, const GgufWriterOptions& options = {});

  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;
  // Closes the file if Finish() was not called; what was written stays.
  ~GgufWriter();

  // Metadata, in file order. Each fails with AlreadyExists for a repeated
  // key, InvalidArgument for an empty key or "general.alignment" (set
  // options.alignment instead), FailedPrecondition once data has started.
  absl::Status AddUint8(absl::string_view key, uint8_t value);
  absl::Status AddInt8(absl::string_view key, int8_t value);
  absl::Status AddUint16(absl::string_view key, uint16_t value);
  absl::Status AddInt16(absl::string_view key, int16_t value);
  absl::Status AddUint32(absl::string_view key, uint32_t value);
  absl::Status AddInt32(absl::string_view key, int32_t value);
  absl::Status AddFloat32(absl::string_view key, float value);
  absl::Status AddBool(absl::string_view key, bool value);
  absl::Status AddString(absl::string_view key, absl::string_view value);
  absl::Status AddUint64(absl::string_view key, uint64_t value);
  absl::Status AddInt64(absl::string_view key, int64_t value);
  absl::Status AddFloat64(absl::string_view key, double value);

  // Arrays of one scalar type or of strings.
  absl::Status AddArray(absl::string_view key, std::span<const uint8_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const int8_t> values);
  absl::Status AddArray(absl::string_view key,
                        std::span<const uint16_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const int16_t> values);
  absl::Status AddArray(absl::string_view key,
                        std::span<const uint32_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const int32_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const float> values);
  absl::Status AddArray(absl::string_view key,
                        std::span<const uint64_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const int64_t> values);
  absl::Status AddArray(absl::string_view key, std::span<const double> values);
  absl::Status AddBoolArray(absl::string_view key,
                            std::span<const bool> values);
  absl::Status AddStringArray(absl::string_view key,
                              std::span<const std::string> values);

  // Any value read by GgufFile, nested arrays included (to copy metadata from
  // one file to another).
  absl::Status AddValue(absl::string_view key, const GgufValue& value);

  // Declares the next tensor. `shape` is outermost first (as in
  // GgufTensorInfo), 1 to 4 dimensions. AlreadyExists for a repeated name;
  // InvalidArgument for a bad shape (see TensorBytes); FailedPrecondition
  // once data has started.
  absl::Status AddTensor(absl::string_view name, DType dtype,
                         std::span<const int64_t> shape);

  // Appends `bytes` to the current tensor's data; when a tensor's last byte
  // arrives the padding follows and the next tensor becomes current.
  // InvalidArgument if `bytes` runs past the current tensor's end (nothing is
  // written then), FailedPrecondition if every tensor is complete.
  absl::Status WriteTensorData(std::span<const uint8_t> bytes);

  // Writes the header if no data was written (a file without tensors), then
  // flushes and closes. FailedPrecondition naming the first incomplete
  // tensor; the errno-derived code for an I/O error.
  absl::Status Finish();

  // Bytes the finished file will have; known once every tensor is declared.
  uint64_t ExpectedFileSize() const;
  // Index of the tensor WriteTensorData() fills next (== tensor count when
  // all are complete).
  size_t current_tensor() const { return current_; }
  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct TensorEntry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // outermost first
    uint64_t offset;             // relative to the data section
    uint64_t nbytes;
  };

  GgufWriter(std::FILE* file, std::string path,
             const GgufWriterOptions& options);

  absl::Status CheckKey(absl::string_view key);
  absl::Status AddScalar(absl::string_view key, GgufType type,
                         const void* value, size_t size);
  absl::Status AddScalarArray(absl::string_view key, GgufType type,
                              const void* values, size_t count, size_t size);
  void AppendValue(const GgufValue& value);
  absl::Status WriteHeader();
  absl::Status WriteBytes(const void* data, size_t size);
  absl::Status WriteZeros(uint64_t count);
  uint64_t HeaderBytes() const;

  std::FILE* file_;
  std::string path_;
  GgufWriterOptions options_;
  std::vector<char> buffer_;  // stdio buffer, owned so it outlives file_

  std::string kv_bytes_;  // serialised metadata, in order
  uint64_t num_kv_ = 0;
  std::set<std::string, std::less<>> keys_;
  std::vector<TensorEntry> tensors_;
  std::set<std::string, std::less<>> tensor_names_;
  uint64_t data_bytes_ = 0;  // data section size including padding

  bool header_written_ = false;
  uint64_t header_bytes_ = 0;  // once written
  bool finished_ = false;
  size_t current_ = 0;         // tensor being written
  uint64_t current_done_ = 0;  // bytes of it written so far
};

}  // namespace baton

#endif  // BATON_MODEL_GGUF_GGUF_WRITER_H_
