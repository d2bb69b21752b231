// RMSNorm over the last dimension.
#ifndef BATON_KERNELS_CPU_RMS_NORM_H_
#define BATON_KERNELS_CPU_RMS_NORM_H_

#include <cstdint>

namespace baton {

// y[t][i] = x[t][i] / sqrt(mean_i(x[t][i]^2) + eps) * weight[i]
// x, y: [tokens, dim] (y may alias x); weight: [dim].
// The mean is accumulated in double in index order, so each row's result
// depends on that row alone (batch invariant) and on no SIMD path.
void RmsNorm(const float* x, const float* weight, int64_t tokens, int64_t dim,
             float eps, float* y);

}  // namespace baton

#endif  // BATON_KERNELS_CPU_RMS_NORM_H_
