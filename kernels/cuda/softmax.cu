// Kernels of softmax.h: one block of kThreads threads per row, three passes
// (max, sum, write), each thread always handling the same strided slice.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/softmax.h"

namespace baton::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Block-wide reduction with a fixed shape; result in every thread.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(kFullMask, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(kFullMask, v, offset);
      v = kMax ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();
  return result;
}

template <bool kLog>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(const float* logits, float* out, int32_t vocab) {
  __shared__ float scratch[kWarps];
  const size_t offset = static_cast<size_t>(blockIdx.x) * vocab;
  const float* z = logits + offset;
  float* y = out + offset;
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, z[i]);
  m = BlockReduce<true>(m, scratch);
  float s = 0.0f;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) s += expf(z[i] - m);
  s = BlockReduce<false>(s, scratch);
  if (kLog) {
    const float log_s = logf(s);
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      y[i] = (z[i] - m) - log_s;
    }
  } else {
    const float inv_s = 1.0f / s;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      y[i] = expf(z[i] - m) * inv_s;
    }
  }
}

template <bool kLog>
cudaError_t Launch(const float* logits, float* out, int32_t batch,
                   int32_t vocab, cudaStream_t stream) {
  if (batch < 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (vocab < 1 || logits == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  SoftmaxKernel<kLog><<<batch, kThreads, 0, stream>>>(logits, out, vocab);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t SoftmaxRows(const float* logits, float* probs, int32_t batch,
                        int32_t vocab, cudaStream_t stream) {
  return Launch<false>(logits, probs, batch, vocab, stream);
}

cudaError_t LogSoftmaxRows(const float* logits, float* logprobs, int32_t batch,
                           int32_t vocab, cudaStream_t stream) {
  return Launch<true>(logits, logprobs, batch, vocab, stream);
}

}  // namespace baton::cuda
