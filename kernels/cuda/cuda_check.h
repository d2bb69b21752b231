// Error propagation inside the CUDA kernels' host entry points, which return
// cudaError_t.
#ifndef BATON_KERNELS_CUDA_CUDA_CHECK_H_
#define BATON_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

// Returns the cudaError_t of `expr` from the enclosing function unless it is
// cudaSuccess.
#define BATON_CUDA_RETURN_IF_ERROR(expr)        \
  do {                                          \
    const cudaError_t baton_cuda_err_ = (expr); \
    if (baton_cuda_err_ != cudaSuccess) {       \
      return baton_cuda_err_;                   \
    }                                           \
  } while (false)

// After a kernel launch: the launch's own error (bad configuration, no
// device), without synchronizing.
#define BATON_CUDA_RETURN_LAUNCH_ERROR() return cudaGetLastError()

#endif  // BATON_KERNELS_CUDA_CUDA_CHECK_H_
