# The element-wise and attention ops of the forward pass.
# Included from kernels/cpu/CMakeLists.txt.

baton_library(baton_cpu_ops
  SRCS ${CMAKE_CURRENT_LIST_DIR}/rms_norm.cc
       ${CMAKE_CURRENT_LIST_DIR}/rope.cc
       ${CMAKE_CURRENT_LIST_DIR}/swiglu.cc
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention.cc
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention_avx2.cc
       ${CMAKE_CURRENT_LIST_DIR}/paged_attention_avx512.cc
  DEPS baton_cpu_features baton_common absl::status absl::statusor absl::strings)
# Every path's attention does its multiply-adds where the code says (one
# order for all paths): no contraction behind its back.
target_compile_options(baton_cpu_ops PRIVATE -ffp-contract=off)

baton_test(rms_norm_test SRCS ${CMAKE_CURRENT_LIST_DIR}/rms_norm_test.cc DEPS baton_cpu_ops)
baton_test(rope_test SRCS ${CMAKE_CURRENT_LIST_DIR}/rope_test.cc DEPS baton_cpu_ops)
baton_test(swiglu_test SRCS ${CMAKE_CURRENT_LIST_DIR}/swiglu_test.cc DEPS baton_cpu_ops)
baton_test(paged_attention_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/paged_attention_test.cc DEPS baton_cpu_ops)

if(NOT BATON_FUZZ)
  add_executable(attention_bench
    ${CMAKE_CURRENT_LIST_DIR}/../../bench/kernels/attention_bench.cc)
  target_compile_options(attention_bench PRIVATE ${BATON_WARNINGS})
  target_link_libraries(attention_bench PRIVATE baton_cpu_ops baton_bench_util
                        absl::strings absl::status absl::statusor)
endif()
