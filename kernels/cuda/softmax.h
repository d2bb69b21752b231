// Row-wise softmax and log-softmax over logits [batch][vocab] float32, in
// float32 with max subtraction:
//   softmax[b][v]     = exp(z[b][v] - m_b) / s_b
//   log_softmax[b][v] = z[b][v] - m_b - log(s_b)
// with m_b = max_v z[b][v] and s_b = sum_v exp(z[b][v] - m_b), summed in a
// fixed order (per thread over a strided slice, then a fixed tree), so the
// result does not depend on the batch. -inf logits give probability 0 and
// log-probability -inf. REQUIRES: every row has a finite entry and no NaN or
// +inf (otherwise the row's outputs are NaN).
//
// Both take device pointers, allow out == logits (in place), and return
// cudaErrorInvalidValue without launching if batch < 0, vocab < 1 with
// batch > 0, or a pointer is null with batch > 0. No synchronization.
#ifndef BATON_KERNELS_CUDA_SOFTMAX_H_
#define BATON_KERNELS_CUDA_SOFTMAX_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// probs: device [batch][vocab] float32.
cudaError_t SoftmaxRows(const float* logits, float* probs, int32_t batch,
                        int32_t vocab, cudaStream_t stream);

// logprobs: device [batch][vocab] float32.
cudaError_t LogSoftmaxRows(const float* logits, float* logprobs, int32_t batch,
                           int32_t vocab, cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_SOFTMAX_H_
