#include "kernels/cpu/rms_norm.h"

#include <cmath>

namespace baton {

void RmsNorm(const float* x, const float* weight, int64_t tokens, int64_t dim,
             float eps, float* y) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * dim;
    float* yt = y + t * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xt[i]) * xt[i];
    float scale = static_cast<float>(1.0 / std::sqrt(sum / dim + eps));
    for (int64_t i = 0; i < dim; ++i) yt[i] = xt[i] * scale * weight[i];
  }
}

}  // namespace baton
