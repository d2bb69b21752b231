// Token embedding lookup on the device: one table row per token, widened to
// float32.
#ifndef BATON_KERNELS_CUDA_EMBEDDING_H_
#define BATON_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// out[t][:] = table[ids[t]][:] for t < tokens.
//   ids:   device, int32 [tokens]
//   table: device, [vocab][dim] of float32 (EmbeddingF32), bfloat16 bits
//          (EmbeddingBF16) or IEEE half bits (EmbeddingF16); the widening to
//          float32 is exact
//   out:   device, float32 [tokens][dim]; must not overlap table
// The ids are not checked on the host (they live on the device): a token whose
// id is outside [0, vocab) gets a row of NaN and nothing is read for it. The
// caller validates ids before uploading them.
// cudaErrorInvalidValue without launching if tokens, vocab or dim is
// negative, vocab * dim overflows, or a pointer is null while tokens * dim > 0.
// Asynchronous on `stream`.
cudaError_t EmbeddingF32(const int32_t* ids, int64_t tokens, const float* table,
                         int64_t vocab, int64_t dim, float* out,
                         cudaStream_t stream);
cudaError_t EmbeddingBF16(const int32_t* ids, int64_t tokens,
                          const uint16_t* table, int64_t vocab, int64_t dim,
                          float* out, cudaStream_t stream);
cudaError_t EmbeddingF16(const int32_t* ids, int64_t tokens,
                         const uint16_t* table, int64_t vocab, int64_t dim,
                         float* out, cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_EMBEDDING_H_
