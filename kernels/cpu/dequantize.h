// Scalar dequantization of GGUF tensor types to float32.
//
// Results are bit-for-bit those of the `gguf` Python package (0.19,
// gguf.quants.dequantize): every scale is widened from half to float first,
// and each product and sum is rounded to float32 in the package's order, e.g.
// Q4_1 is (d * q) + m and Q4_K is (d * sc) * q - (dmin * m). This is a load
// time and test path; the engine's matmuls use quantized dot products.
#ifndef BATON_KERNELS_CPU_DEQUANTIZE_H_
#define BATON_KERNELS_CPU_DEQUANTIZE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/tensor.h"

namespace baton {

// True for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
// Q5_K and Q6_K.
bool CanDequantize(DType dtype);

// Dequantizes `n` consecutive elements: src holds n / block_size blocks of
// `dtype` (block_bytes each, any alignment), dst receives n floats.
// InvalidArgument if n is negative or not a multiple of the block size;
// Unimplemented (naming the type) if !CanDequantize(dtype).
absl::Status DequantizeRow(DType dtype, const void* src, float* dst, int64_t n);

// All elements of `tensor`, row-major (innermost dimension fastest).
// InvalidArgument if tensor.nbytes disagrees with its dtype and shape or data
// is null; Unimplemented if !CanDequantize(tensor.dtype).
absl::StatusOr<std::vector<float>> DequantizeTensor(const TensorView& tensor);

}  // namespace baton

#endif  // BATON_KERNELS_CPU_DEQUANTIZE_H_
