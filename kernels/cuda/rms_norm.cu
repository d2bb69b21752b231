#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rms_norm.h"

namespace baton::cuda {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kWarp = 32;
// Rows beyond this many blocks are handled by a grid-stride loop.
constexpr int64_t kMaxBlocks = 65535;

// Threads per row: a multiple of 32 in [32, 1024], a function of dim alone so
// the reduction tree (hence the result) does not depend on the batch.
int ThreadsFor(int64_t dim) {
  const int64_t rounded = (dim + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(rounded < kMaxThreads ? rounded : kMaxThreads);
}

// Sum of `v` over the block, returned to every thread. blockDim.x is a
// multiple of 32 and at most 1024. Starts and ends with a barrier, so
// `warp_sums` may be reused by the next call.
__device__ double BlockSum(double v, double* warp_sums) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int num_warps = blockDim.x / kWarp;
  __syncthreads();  // the previous row's readers of warp_sums are done
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < num_warps; ++w) total += warp_sums[w];
  __syncthreads();
  return total;
}

// One block per row (grid-stride over rows). With delta != nullptr, x is
// first updated to x + delta. Every thread of a block runs the same rows, so
// the barriers inside BlockSum are reached uniformly.
__global__ void RmsNormKernel(float* x, const float* delta,
                              const float* __restrict__ weight, int64_t tokens,
                              int64_t dim, float eps, float* y) {
  __shared__ double warp_sums[kMaxThreads / kWarp];
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float* xt = x + t * dim;
    float* yt = y + t * dim;
    double sum = 0.0;
    if (delta != nullptr) {
      const float* dt = delta + t * dim;
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = __fadd_rn(xt[i], dt[i]);
        xt[i] = v;
        sum += static_cast<double>(v) * static_cast<double>(v);
      }
    } else {
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const double v = xt[i];
        sum += v * v;
      }
    }
    sum = BlockSum(sum, warp_sums);
    // As the CPU: the double mean plus eps, one rounding to float.
    const float scale = static_cast<float>(
        1.0 / sqrt(sum / static_cast<double>(dim) + static_cast<double>(eps)));
    // Each thread reads back only elements it wrote (or read) above, so y may
    // alias x or delta.
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      yt[i] = __fmul_rn(__fmul_rn(xt[i], scale), weight[i]);
    }
  }
}

cudaError_t Launch(float* x, const float* delta, const float* weight,
                   int64_t tokens, int64_t dim, float eps, float* y,
                   cudaStream_t stream) {
  if (tokens < 0 || dim < 0) return cudaErrorInvalidValue;
  if (tokens > 0 && dim > INT64_MAX / tokens) return cudaErrorInvalidValue;
  if (tokens == 0 || dim == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr || y == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks =
      static_cast<unsigned>(tokens < kMaxBlocks ? tokens : kMaxBlocks);
  RmsNormKernel<<<blocks, ThreadsFor(dim), 0, stream>>>(x, delta, weight,
                                                        tokens, dim, eps, y);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t RmsNorm(const float* x, const float* weight, int64_t tokens,
                    int64_t dim, float eps, float* y, cudaStream_t stream) {
  // The kernel writes x only when delta is set.
  return Launch(const_cast<float*>(x), nullptr, weight, tokens, dim, eps, y,
                stream);
}

cudaError_t AddRmsNorm(float* x, const float* delta, const float* weight,
                       int64_t tokens, int64_t dim, float eps, float* y,
                       cudaStream_t stream) {
  if (delta == nullptr && tokens > 0 && dim > 0) return cudaErrorInvalidValue;
  return Launch(x, delta, weight, tokens, dim, eps, y, stream);
}

}  // namespace baton::cuda
