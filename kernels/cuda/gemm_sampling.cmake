# GEMM (cuBLAS) and per-row logits kernels: argmax, softmax, log-softmax and
# the sampler's temperature/top-k/top-p/min-p draw. Included by
# kernels/cuda/CMakeLists.txt.

baton_cuda_library(baton_cuda_gemm
  SRCS gemm.cc
  DEPS CUDA::cublas absl::status absl::statusor absl::strings)

baton_cuda_library(baton_cuda_sampling
  SRCS sampling.cc sampling_argmax.cu sampling_draw.cu softmax.cu)

baton_test(cuda_gemm_test SRCS gemm_test.cc
  DEPS baton_cuda_gemm baton_cuda_test_util)

baton_test(cuda_sampling_test SRCS sampling_test.cc
  DEPS baton_cuda_sampling baton_cuda_test_util baton_sampler)
