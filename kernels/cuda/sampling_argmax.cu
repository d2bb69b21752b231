// ArgmaxRows of sampling.h: one block of kThreads threads per row, one pass
// over the logits (BlockBest).
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sampling_internal.h"

namespace baton::cuda {
namespace {

using sampling_internal::Best;
using sampling_internal::BlockBest;
using sampling_internal::CheckRows;
using sampling_internal::kThreads;
using sampling_internal::Shared;

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* logits, int32_t* tokens, int32_t vocab) {
  __shared__ Shared sh;
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const Best best = BlockBest(row, vocab, /*finite_only=*/false, sh);
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = best.id == INT32_MAX ? -1 : best.id;
  }
}

}  // namespace

cudaError_t ArgmaxRows(const float* logits, int32_t* tokens, int32_t batch,
                       int32_t vocab, cudaStream_t stream) {
  BATON_CUDA_RETURN_IF_ERROR(CheckRows(logits, tokens, tokens, batch, vocab));
  if (batch == 0) return cudaSuccess;
  ArgmaxKernel<<<batch, kThreads, 0, stream>>>(logits, tokens, vocab);
  BATON_CUDA_RETURN_LAUNCH_ERROR();
}

}  // namespace baton::cuda
