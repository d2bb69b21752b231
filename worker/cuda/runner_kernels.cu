#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda/cuda_check.h"
#include "worker/cuda/runner_kernels.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
// Larger work is covered by grid-stride loops.
constexpr int64_t kMaxBlocks = 1 << 16;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a * b for a, b >= 0, or -1 if it overflows int64.
int64_t CheckedMul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > kInt64Max / a) return -1;
  return a * b;
}

int GridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// One thread per (token, kv head, dim) element, grid-stride.
__global__ void WriteKvKernel(const float* k, const float* v,
                              const int32_t* positions,
                              const int32_t* token_blocks, int64_t n,
                              int64_t kv_dim, int64_t head_dim,
                              int64_t block_size, int64_t num_blocks,
                              int64_t layer, int64_t half_chunk,
                              uint16_t* pool) {
  for (int64_t e = FirstIndex(); e < n; e += GridStride()) {
    const int64_t t = e / kv_dim;
    const int64_t r = e - t * kv_dim;
    const int64_t h = r / head_dim;
    const int64_t d = r - h * head_dim;
    const int64_t block = token_blocks[t];
    const int64_t pos = positions[t];
    if (block < 0 || block >= num_blocks || pos < 0) continue;
    const int64_t slot = pos % block_size;
    const int64_t index = (layer * num_blocks + block) * 2 * half_chunk +
                          (h * block_size + slot) * head_dim + d;
    pool[index] = __half_as_ushort(__float2half_rn(k[e]));
    pool[index + half_chunk] = __half_as_ushort(__float2half_rn(v[e]));
  }
}

__global__ void F32ToBF16Kernel(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

__global__ void AddBiasKernel(float* x, const float* bias, int64_t n,
                              int64_t cols) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    x[i] = __fadd_rn(x[i], bias[i % cols]);
  }
}

__global__ void GatherRowsKernel(const float* x, int64_t x_rows,
                                 const int32_t* rows, int64_t n, int64_t dim,
                                 float* out) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const int64_t r = i / dim;
    const int64_t c = i - r * dim;
    const int64_t src = rows[r];
    out[i] = (src >= 0 && src < x_rows) ? x[src * dim + c]
                                        : __int_as_float(0x7fc00000);
  }
}

}  // namespace

cudaError_t WriteKvF16(const float* k, const float* v, const int32_t* positions,
                       const int32_t* token_blocks, int64_t tokens,
                       const KvPoolShape& shape, int64_t layer, uint16_t* pool,
                       cudaStream_t stream) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size <= 0 ||
      tokens < 0 || layer < 0 || layer >= shape.num_layers) {
    return cudaErrorInvalidValue;
  }
  const int64_t kv_dim = CheckedMul(shape.num_kv_heads, shape.head_dim);
  const int64_t half_chunk = CheckedMul(kv_dim, shape.block_size);
  const int64_t chunks = CheckedMul(shape.num_layers, shape.num_blocks);
  const int64_t pool_elems = CheckedMul(CheckedMul(chunks, 2), half_chunk);
  const int64_t n = CheckedMul(tokens, kv_dim);
  if (kv_dim < 0 || half_chunk < 0 || chunks < 0 || pool_elems < 0 || n < 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (k == nullptr || v == nullptr || positions == nullptr ||
      token_blocks == nullptr || pool == nullptr) {
    return cudaErrorInvalidValue;
  }
  WriteKvKernel<<<GridFor(n), kThreads, 0, stream>>>(
      k, v, positions, token_blocks, n, kv_dim, shape.head_dim,
      shape.block_size, shape.num_blocks, layer, half_chunk, pool);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

cudaError_t F32ToBF16(const float* x, int64_t n, uint16_t* y,
                      cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  F32ToBF16Kernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, y);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

cudaError_t AddBias(float* x, const float* bias, int64_t rows, int64_t cols,
                    cudaStream_t stream) {
  const int64_t n = CheckedMul(rows, cols);
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (x == nullptr || bias == nullptr) return cudaErrorInvalidValue;
  AddBiasKernel<<<GridFor(n), kThreads, 0, stream>>>(x, bias, n, cols);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

cudaError_t GatherRows(const float* x, int64_t x_rows, const int32_t* rows,
                       int64_t n_rows, int64_t dim, float* out,
                       cudaStream_t stream) {
  const int64_t n = CheckedMul(n_rows, dim);
  if (x_rows < 0 || n < 0 || CheckedMul(x_rows, dim) < 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (x == nullptr || rows == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  GatherRowsKernel<<<GridFor(n), kThreads, 0, stream>>>(x, x_rows, rows, n, dim,
                                                        out);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace baton::cuda
