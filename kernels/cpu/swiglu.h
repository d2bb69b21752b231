// The SwiGLU gate of a Llama MLP.
#ifndef BATON_KERNELS_CPU_SWIGLU_H_
#define BATON_KERNELS_CPU_SWIGLU_H_

#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace baton {

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x), for i < n.
// out may alias gate or up. e^-x is this kernel's own (within about 1 ulp),
// computed with the same operations on every path: the same bits whatever
// `isa`.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out,
            CpuIsa isa = BestCpuIsa());

}  // namespace baton

#endif  // BATON_KERNELS_CPU_SWIGLU_H_
