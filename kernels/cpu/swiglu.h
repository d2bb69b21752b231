// The SwiGLU gate of a Llama MLP.
#ifndef BATON_KERNELS_CPU_SWIGLU_H_
#define BATON_KERNELS_CPU_SWIGLU_H_

#include <cstdint>

namespace baton {

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x), for i < n.
// out may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

}  // namespace baton

#endif  // BATON_KERNELS_CPU_SWIGLU_H_
