// Dequantization of GGUF tensor data on the device, to float32 or bfloat16.
#ifndef BATON_KERNELS_CUDA_DEQUANTIZE_H_
#define BATON_KERNELS_CUDA_DEQUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/tensor.h"

namespace baton::cuda {

// True for the types baton::CanDequantize accepts (kernels/cpu/dequantize.h):
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool CanDequantizeOnDevice(DType dtype);

// Dequantizes `n` consecutive elements as baton::DequantizeRow does, bit for
// bit: every scale is widened from half exactly, and each product and sum is
// rounded to float32 in the CPU's order (no fused multiply-add).
//   src: device, n / block_size blocks of `dtype` (block_bytes each, any
//        alignment)
//   dst: device, n float32 (DequantizeToF32) or n bfloat16 bits
//        (DequantizeToBF16: the float32 value rounded to nearest even, as
//        baton::F32ToBF16); must not overlap src
// cudaErrorInvalidValue without launching if !CanDequantizeOnDevice(dtype), n
// is negative or not a multiple of the block size, or a pointer is null while
// n > 0. Asynchronous on `stream`.
cudaError_t DequantizeToF32(DType dtype, const void* src, int64_t n, float* dst,
                            cudaStream_t stream);
cudaError_t DequantizeToBF16(DType dtype, const void* src, int64_t n,
                             uint16_t* dst, cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_DEQUANTIZE_H_
