// RMSNorm over the last dimension on the device, and the fused residual add +
// RMSNorm of a pre-norm transformer block.
#ifndef BATON_KERNELS_CUDA_RMS_NORM_H_
#define BATON_KERNELS_CUDA_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// y[t][i] = x[t][i] * s_t * weight[i], s_t = 1 / sqrt(mean_i(x[t][i]^2) + eps),
// as baton::RmsNorm (kernels/cpu/rms_norm.h): the sum of squares is
// accumulated in double, s_t is rounded to float once, and y = (x * s) * w
// with each product rounded. Only the order of the double sum differs from
// the CPU (a fixed tree that depends on dim alone, so each row's result is
// independent of the batch); s_t agrees with the CPU or is one float ulp off.
//   x, y:   device, float32 [tokens][dim]; y may alias x (no other overlap)
//   weight: device, float32 [dim]
// cudaErrorInvalidValue without launching if tokens or dim is negative,
// tokens * dim overflows, or a pointer is null while tokens * dim > 0.
// Asynchronous on `stream`.
cudaError_t RmsNorm(const float* x, const float* weight, int64_t tokens,
                    int64_t dim, float eps, float* y, cudaStream_t stream);

// x[t][i] += delta[t][i] (float32, rounded once, as a separate add would),
// then y = RmsNorm(x) over the updated x: one pass instead of an add kernel
// and a norm kernel.
//   x:      device, float32 [tokens][dim], updated in place (the residual
//           stream)
//   delta:  device, float32 [tokens][dim] (e.g. the attention output)
//   y:      device, float32 [tokens][dim]; may alias x or delta
//   weight: device, float32 [dim]
// Errors as RmsNorm.
cudaError_t AddRmsNorm(float* x, const float* delta, const float* weight,
                       int64_t tokens, int64_t dim, float eps, float* y,
                       cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_RMS_NORM_H_
