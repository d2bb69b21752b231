# The CUDA forward pass (worker/cuda/cuda_model_runner.h), its test against
# the CPU ModelRunner and the forward-pass benchmark. Included from
# worker/cuda/CMakeLists.txt when BATON_CUDA=ON.

add_library(baton_cuda_runner STATIC
  ${CMAKE_CURRENT_LIST_DIR}/runner_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/device_memory.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_weights.cc
  ${CMAKE_CURRENT_LIST_DIR}/forward_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_graph_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_graph_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_graph_step.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_model_runner.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_model_runner_layer.cc)
target_include_directories(baton_cuda_runner PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_options(baton_cuda_runner PRIVATE ${BATON_CUDA_WARNINGS})
target_link_libraries(baton_cuda_runner PUBLIC
  baton_cuda_elementwise baton_cuda_attention baton_cuda_gemm baton_model_runner
  baton_dequantize
  baton_kv_cache baton_common CUDA::cudart absl::status absl::statusor
  absl::strings)

# Plan/validation tests (the decode-graph plan included) run everywhere; the
# device tests skip without a GPU.
baton_test(cuda_model_runner_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/forward_plan_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/decode_graph_plan_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/decode_graph_runner_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/runner_kernels_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/cuda_model_runner_test.cc
  DEPS baton_cuda_runner baton_cuda_test_util baton_model_runner
       baton_kv_cache baton_tokenizer baton_test_util)

# Decode/prefill throughput of a synthetic Llama-3-8B against the measured
# HBM bandwidth and bf16 GEMM rate.
add_executable(cuda_forward_bench
  ${CMAKE_CURRENT_LIST_DIR}/cuda_forward_bench.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_bench_ceilings.cc)
target_compile_options(cuda_forward_bench PRIVATE ${BATON_WARNINGS})
target_link_libraries(cuda_forward_bench PRIVATE baton_cuda_runner baton_synth
                      absl::flags absl::flags_parse absl::strings)
set_target_properties(cuda_forward_bench PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
