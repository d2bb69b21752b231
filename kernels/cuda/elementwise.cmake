# The element-wise CUDA kernels of the forward pass: embedding gather, RMSNorm
# (plain and fused with the residual add), RoPE, SwiGLU and the residual add,
# GGUF dequantization, and the KV block gather/scatter for transfers.
# Included from kernels/cuda/CMakeLists.txt.

baton_cuda_library(baton_cuda_elementwise
  SRCS ${CMAKE_CURRENT_LIST_DIR}/embedding.cu
       ${CMAKE_CURRENT_LIST_DIR}/rms_norm.cu
       ${CMAKE_CURRENT_LIST_DIR}/rope.cu
       ${CMAKE_CURRENT_LIST_DIR}/activation.cu
       ${CMAKE_CURRENT_LIST_DIR}/dequantize.cu
       ${CMAKE_CURRENT_LIST_DIR}/kv_blocks.cu
  # Headers only: rope.h takes RopeOptions (kernels/cpu/rope.h, which needs
  # absl), dequantize.h names DType (model/tensor.h).
  DEPS absl::status absl::statusor)

# Each kernel against its CPU counterpart; skipped without a device.
baton_test(cuda_elementwise_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/embedding_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/rms_norm_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/rope_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/activation_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/dequantize_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/kv_blocks_test.cc
  DEPS baton_cuda_elementwise baton_cuda_test_util baton_cpu_ops
       baton_dequantize baton_kv_cache baton_tensor)
