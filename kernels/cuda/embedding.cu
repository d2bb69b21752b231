#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"

namespace baton::cuda {
namespace {

enum class TableType : int { kF32, kBF16, kF16 };

constexpr int kMaxThreads = 256;
// Rows beyond this many blocks are handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 65535;

// One block per row (grid-stride over rows); threads stride over dim.
__global__ void EmbeddingKernel(const int32_t* __restrict__ ids, int64_t tokens,
                                const void* __restrict__ table, TableType type,
                                int64_t vocab, int64_t dim,
                                float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t id = ids[t];
    float* row_out = out + t * dim;
    if (id < 0 || id >= vocab) {
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        row_out[i] = __int_as_float(0x7fc00000);  // quiet NaN
      }
      continue;
    }
    const int64_t base = id * dim;
    switch (type) {
      case TableType::kF32: {
        const float* row = static_cast<const float*>(table) + base;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
          row_out[i] = row[i];
        }
        break;
      }
      case TableType::kBF16: {
        const uint16_t* row = static_cast<const uint16_t*>(table) + base;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
          row_out[i] = __uint_as_float(static_cast<uint32_t>(row[i]) << 16);
        }
        break;
      }
      case TableType::kF16: {
        const uint16_t* row = static_cast<const uint16_t*>(table) + base;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
          row_out[i] = __half2float(__ushort_as_half(row[i]));
        }
        break;
      }
    }
  }
}

cudaError_t Launch(const int32_t* ids, int64_t tokens, const void* table,
                   TableType type, int64_t vocab, int64_t dim, float* out,
                   cudaStream_t stream) {
  if (tokens < 0 || vocab < 0 || dim < 0) return cudaErrorInvalidValue;
  if (dim > 0 && vocab > INT64_MAX / dim) return cudaErrorInvalidValue;
  if (tokens > 0 && dim > INT64_MAX / tokens) return cudaErrorInvalidValue;
  if (tokens == 0 || dim == 0) return cudaSuccess;
  if (ids == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (table == nullptr && vocab > 0) return cudaErrorInvalidValue;
  const int threads =
      static_cast<int>(dim >= kMaxThreads ? kMaxThreads : (dim + 31) / 32 * 32);
  const unsigned blocks =
      static_cast<unsigned>(tokens < kMaxBlocks ? tokens : kMaxBlocks);
  EmbeddingKernel<<<blocks, threads, 0, stream>>>(ids, tokens, table, type,
                                                  vocab, dim, out);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t EmbeddingF32(const int32_t* ids, int64_t tokens, const float* table,
                         int64_t vocab, int64_t dim, float* out,
                         cudaStream_t stream) {
  return Launch(ids, tokens, table, TableType::kF32, vocab, dim, out, stream);
}

cudaError_t EmbeddingBF16(const int32_t* ids, int64_t tokens,
                          const uint16_t* table, int64_t vocab, int64_t dim,
                          float* out, cudaStream_t stream) {
  return Launch(ids, tokens, table, TableType::kBF16, vocab, dim, out, stream);
}

cudaError_t EmbeddingF16(const int32_t* ids, int64_t tokens,
                         const uint16_t* table, int64_t vocab, int64_t dim,
                         float* out, cudaStream_t stream) {
  return Launch(ids, tokens, table, TableType::kF16, vocab, dim, out, stream);
}

}  // namespace baton::cuda
