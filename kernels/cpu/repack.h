// Load-time repacking of GGUF weight types the CPU matmul has no kernel for
// into layouts it multiplies directly (tensor.h's internal dtypes), each
// exact: the repacked blocks dequantize to the original blocks' bits.
//
//   Q4_K -> Q4_K_R  f32 d * sc, f32 -(dmin * m), nibbles in Q4_1's order
//                   (6 bits a weight)
//   Q5_K -> Q5_K_R  f32 d * sc, f32 -(dmin * m), codes 0..31 as bytes
//   Q5_1 -> Q5_K_R  f32 d, f32 m, codes 0..31 as bytes (10 bits)
//   Q6_K -> Q6_K_R  f32 d * sc of each half block, codes q - 32 as int8
//   Q3_K -> Q6_K_R  f32 d * (sc - 32) of each half block, codes -4..3 (10)
//   Q5_0 -> Q8_0    the same f16 d, codes q - 16 as int8 (8.5)
//
// Every product is exact in f32 (an f16 times a 6- or 8-bit integer).
#ifndef BATON_KERNELS_CPU_REPACK_H_
#define BATON_KERNELS_CPU_REPACK_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tensor.h"

namespace baton {

// The layout a weight matrix of `dtype` is repacked into, or nullopt.
std::optional<DType> CpuMatMulRepackTarget(DType dtype);

// The tensor's bytes in CpuMatMulRepackTarget(tensor.dtype). InvalidArgument
// for a type without one, or a view whose size disagrees with its shape.
absl::StatusOr<std::vector<uint8_t>> RepackForCpuMatMul(
    const TensorView& tensor);

}  // namespace baton

#endif  // BATON_KERNELS_CPU_REPACK_H_
