# Paged attention on the GPU (prefill and split decode) and its test against
# the CPU kernel. Included from kernels/cuda/CMakeLists.txt.

baton_cuda_library(baton_cuda_attention
  SRCS ${CMAKE_CURRENT_LIST_DIR}/paged_attention_prefill.cu
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention_decode.cu)

# Argument checks run everywhere; the kernel comparisons with
# kernels/cpu/paged_attention.h skip without a device.
baton_test(cuda_paged_attention_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/paged_attention_args_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention_decode_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention_prefill_test.cc
  DEPS baton_cuda_attention baton_cuda_test_util baton_cpu_ops)
