#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequantize.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
// Elements beyond kThreads * kMaxBlocks are handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 1 << 16;

// Block layouts are ggml's, as documented per type in
// kernels/cpu/dequantize.cc; each function returns element `e` of the block
// at `b` with the CPU's roundings. Bytes are read one at a time: blocks have
// any alignment.

__device__ __forceinline__ float Half(const uint8_t* p) {
  const uint16_t bits = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint32_t U32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Nibble of element e < 32 of a legacy block: low nibble of qs[e] for
// e < 16, high nibble of qs[e - 16] otherwise.
__device__ __forceinline__ int Nibble32(const uint8_t* qs, int e) {
  return e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
}

__device__ float Q4_0(const uint8_t* b, int e) {
  return __fmul_rn(Half(b), static_cast<float>(Nibble32(b + 2, e) - 8));
}

__device__ float Q4_1(const uint8_t* b, int e) {
  return __fadd_rn(__fmul_rn(Half(b), static_cast<float>(Nibble32(b + 4, e))),
                   Half(b + 2));
}

__device__ float Q5_0(const uint8_t* b, int e) {
  const int v = Nibble32(b + 6, e) | (((U32(b + 2) >> e) & 1) << 4);
  return __fmul_rn(Half(b), static_cast<float>(v - 16));
}

__device__ float Q5_1(const uint8_t* b, int e) {
  const int v = Nibble32(b + 8, e) | (((U32(b + 4) >> e) & 1) << 4);
  return __fadd_rn(__fmul_rn(Half(b), static_cast<float>(v)), Half(b + 2));
}

__device__ float Q8_0(const uint8_t* b, int e) {
  const int8_t q = static_cast<int8_t>(b[2 + e]);
  return __fmul_rn(static_cast<float>(q), Half(b));
}

__device__ float Q2_K(const uint8_t* b, int e) {
  const int sub = e / 16;
  const int l = e % 16;
  const uint8_t sc = b[sub];
  const float dl = __fmul_rn(Half(b + 80), static_cast<float>(sc & 0xF));
  const float ml = __fmul_rn(Half(b + 82), static_cast<float>(sc >> 4));
  const uint8_t q = b[16 + 32 * (sub / 8) + 16 * (sub % 2) + l];
  const int shift = 2 * ((sub % 8) / 2);
  return __fsub_rn(__fmul_rn(dl, static_cast<float>((q >> shift) & 3)), ml);
}

__device__ float Q3_K(const uint8_t* b, int e) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const int sub = e / 16;
  const int l = e % 16;
  const int sc = ((scales[sub % 8] >> (4 * (sub / 8))) & 0xF) |
                 (((scales[8 + sub % 4] >> (2 * (sub / 4))) & 3) << 4);
  const float dl = __fmul_rn(Half(b + 108), static_cast<float>(sc - 32));
  const int l0 = 16 * (sub % 2);
  const int low = (qs[32 * (sub / 8) + l0 + l] >> (2 * ((sub % 8) / 2))) & 3;
  const int high = (hmask[l0 + l] >> (sub / 2)) & 1;
  return __fmul_rn(dl, static_cast<float>(low - (high ? 0 : 4)));
}

// Scale and min of sub-block `sub` < 8 from the 12 packed bytes at s.
__device__ __forceinline__ void ScaleMin(const uint8_t* s, int sub, int* sc,
                                         int* mn) {
  if (sub < 4) {
    *sc = s[sub] & 0x3F;
    *mn = s[4 + sub] & 0x3F;
  } else {
    const int i = sub - 4;
    *sc = (s[8 + i] & 0xF) | ((s[i] >> 2) & 0x30);
    *mn = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
  }
}

// Q4_K (with_high == false) and Q5_K (with_high == true).
__device__ float Q45_K(const uint8_t* b, int e, bool with_high) {
  const int sub = e / 32;
  const int l = e % 32;
  int sc, mn;
  ScaleMin(b + 4, sub, &sc, &mn);
  const float dl = __fmul_rn(Half(b), static_cast<float>(sc));
  const float ml = __fmul_rn(Half(b + 2), static_cast<float>(mn));
  const uint8_t* qs = with_high ? b + 48 : b + 16;
  int v = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF;
  if (with_high) v |= ((b[16 + l] >> sub) & 1) << 4;
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(v)), ml);
}

__device__ float Q6_K(const uint8_t* b, int e) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int sub = e / 16;
  const int l = e % 16;
  const int8_t scale = static_cast<int8_t>(b[192 + sub]);
  const float dl = __fmul_rn(Half(b + 208), static_cast<float>(scale));
  const int e0 = 16 * sub;
  const int j = e0 / 128;
  const int r = e0 % 128;
  const int lo = (ql[64 * j + r % 64 + l] >> (4 * (r / 64))) & 0xF;
  const int hi = (qh[32 * j + r % 32 + l] >> (2 * (r / 32))) & 3;
  return __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
}

// Element e < block_size of the block at b.
__device__ float Element(DType dtype, const uint8_t* b, int e) {
  switch (dtype) {
    case DType::kF32:
      return __uint_as_float(U32(b + 4 * e));
    case DType::kF16:
      return Half(b + 2 * e);
    case DType::kBF16:
      return __uint_as_float(
          static_cast<uint32_t>(b[2 * e] | (b[2 * e + 1] << 8)) << 16);
    case DType::kQ4_0:
      return Q4_0(b, e);
    case DType::kQ4_1:
      return Q4_1(b, e);
    case DType::kQ5_0:
      return Q5_0(b, e);
    case DType::kQ5_1:
      return Q5_1(b, e);
    case DType::kQ8_0:
      return Q8_0(b, e);
    case DType::kQ2_K:
      return Q2_K(b, e);
    case DType::kQ3_K:
      return Q3_K(b, e);
    case DType::kQ4_K:
      return Q45_K(b, e, false);
    case DType::kQ5_K:
      return Q45_K(b, e, true);
    case DType::kQ6_K:
      return Q6_K(b, e);
    default:
      return __int_as_float(0x7fc00000);  // unreachable: checked on the host
  }
}

// Round to nearest even as baton::F32ToBF16 (NaN stays a quiet NaN).
__device__ __forceinline__ uint16_t ToBF16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// One thread per output element (grid-stride). Exactly one of dst_f32 and
// dst_bf16 is non-null.
__global__ void DequantizeKernel(DType dtype, const uint8_t* __restrict__ src,
                                 int64_t n, int block_size, int block_bytes,
                                 float* __restrict__ dst_f32,
                                 uint16_t* __restrict__ dst_bf16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const int64_t block = i / block_size;
    const int e = static_cast<int>(i - block * block_size);
    const float y = Element(dtype, src + block * block_bytes, e);
    if (dst_f32 != nullptr) {
      dst_f32[i] = y;
    } else {
      dst_bf16[i] = ToBF16(y);
    }
  }
}

struct Geometry {
  int block_size = 0;
  int block_bytes = 0;
};

// {0, 0} for a type without a device kernel. Values are DTypeInfo's
// (model/tensor.h); the test checks they agree.
Geometry GeometryOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {1, 4};
    case DType::kF16:
    case DType::kBF16:
      return {1, 2};
    case DType::kQ4_0:
      return {32, 18};
    case DType::kQ4_1:
      return {32, 20};
    case DType::kQ5_0:
      return {32, 22};
    case DType::kQ5_1:
      return {32, 24};
    case DType::kQ8_0:
      return {32, 34};
    case DType::kQ2_K:
      return {256, 84};
    case DType::kQ3_K:
      return {256, 110};
    case DType::kQ4_K:
      return {256, 144};
    case DType::kQ5_K:
      return {256, 176};
    case DType::kQ6_K:
      return {256, 210};
    default:
      return {};
  }
}

cudaError_t Launch(DType dtype, const void* src, int64_t n, float* dst_f32,
                   uint16_t* dst_bf16, cudaStream_t stream) {
  const Geometry g = GeometryOf(dtype);
  if (g.block_size == 0 || n < 0 || n % g.block_size != 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (src == nullptr || (dst_f32 == nullptr && dst_bf16 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // Source bytes n / block_size * block_bytes must fit in int64.
  if (n / g.block_size > INT64_MAX / g.block_bytes) {
    return cudaErrorInvalidValue;
  }
  const int64_t needed = (n + kThreads - 1) / kThreads;
  const unsigned blocks =
      static_cast<unsigned>(needed < kMaxBlocks ? needed : kMaxBlocks);
  DequantizeKernel<<<blocks, kThreads, 0, stream>>>(
      dtype, static_cast<const uint8_t*>(src), n, g.block_size, g.block_bytes,
      dst_f32, dst_bf16);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

bool CanDequantizeOnDevice(DType dtype) {
  return GeometryOf(dtype).block_size != 0;
}

cudaError_t DequantizeToF32(DType dtype, const void* src, int64_t n, float* dst,
                            cudaStream_t stream) {
  if (dst == nullptr && n > 0) return cudaErrorInvalidValue;
  return Launch(dtype, src, n, dst, nullptr, stream);
}

cudaError_t DequantizeToBF16(DType dtype, const void* src, int64_t n,
                             uint16_t* dst, cudaStream_t stream) {
  if (dst == nullptr && n > 0) return cudaErrorInvalidValue;
  return Launch(dtype, src, n, nullptr, dst, stream);
}

}  // namespace baton::cuda
