// Element types and a non-owning view of one weight tensor, shared by the GGUF
// and safetensors readers and the dequantization kernels.
#ifndef BATON_MODEL_TENSOR_H_
#define BATON_MODEL_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// Values are ggml's type ids, so a GGUF file's type field maps directly.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  // Baton's own layouts, made at load time and never read from a file:
  // Q4_K repacked for the CPU matmul: per 32 weights an f32 scale d, an f32
  // min m and 16 bytes of nibbles in Q4_1's order (w = d * q + m; exact:
  // d = d_K * sc and m = -dmin_K * mn fit an f32 exactly).
  kQ4_KR = 4096,
  // Q6_K repacked for the CPU matmul: per 32 weights two f32 scales (of
  // weights 0-15 and 16-31; d_K * sc, exact) and 32 int8 codes: w = s * q.
  kQ6_KR = 4097,
  // Q5_K (and Q5_1) repacked for the CPU matmul: per 32 weights an f32 scale,
  // an f32 min and 32 codes 0..31 as bytes: w = d * q + m.
  kQ5_KR = 4098,
};

struct DTypeInfo {
  DType dtype;
  absl::string_view name;  // ggml's spelling: "F32", "Q4_1", "Q6_K", ...
  int64_t block_size;      // elements per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
  // One of Baton's load-time layouts, never valid in a model file.
  bool internal = false;
};

// nullptr for an id ggml does not define (or that Baton does not know);
// Baton's internal layouts are found too (DTypeInfo::internal).
const DTypeInfo* FindDTypeInfo(uint32_t ggml_type);
// REQUIRES: dtype is one of the enumerators above.
const DTypeInfo& GetDTypeInfo(DType dtype);
inline absl::string_view DTypeName(DType dtype) {
  return GetDTypeInfo(dtype).name;
}

// Bytes of a tensor of `shape` (outermost dimension first). InvalidArgument if
// the innermost dimension is not a multiple of the block size, a dimension is
// negative, or the element count or byte count overflows 63 bits.
absl::StatusOr<uint64_t> TensorBytes(DType dtype,
                                     std::span<const int64_t> shape);

// A weight tensor inside a mapped file. Shape is outermost first (numpy /
// PyTorch order): a GGUF tensor with ne = [576, 1536] has shape {1536, 576},
// i.e. 1536 rows of 576 elements.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Elements per row (innermost dimension); 1 for a scalar.
  int64_t RowSize() const { return shape.empty() ? 1 : shape.back(); }
  int64_t NumRows() const {
    return RowSize() == 0 ? 0 : NumElements() / RowSize();
  }
};

// "[1536, 576]".
std::string ShapeToString(std::span<const int64_t> shape);

}  // namespace baton

#endif  // BATON_MODEL_TENSOR_H_
