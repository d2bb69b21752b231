// Element-wise float32 ops of the MLP and the residual stream on the device.
#ifndef BATON_KERNELS_CUDA_ACTIVATION_H_
#define BATON_KERNELS_CUDA_ACTIVATION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::cuda {

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g), for i < n, in the
// order of baton::SwiGlu (kernels/cpu/swiglu.h): (g / (1 + exp(-g))) * up,
// each step rounded to float. expf differs from the host's libm by at most
// 2 ulp, so results agree with the CPU to a few ulp, not bit for bit.
//   gate, up, out: device, float32 [n]; out may alias gate or up (exactly,
//   not partially)
// cudaErrorInvalidValue without launching if n < 0 or a pointer is null while
// n > 0. Asynchronous on `stream`.
cudaError_t SwiGlu(const float* gate, const float* up, int64_t n, float* out,
                   cudaStream_t stream);

// x[i] += y[i] for i < n (one float32 rounding: bit-exact with the host).
//   x: device, float32 [n], updated in place
//   y: device, float32 [n]; may alias x (exactly, not partially)
// Errors as SwiGlu.
cudaError_t AddInPlace(float* x, const float* y, int64_t n,
                       cudaStream_t stream);

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_ACTIVATION_H_
