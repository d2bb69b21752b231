# CPU matrix-multiply kernels, their thread pool and benchmark.
# Included from kernels/cpu/CMakeLists.txt.

baton_library(baton_cpu_features
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cpu_features.cc
  DEPS absl::status absl::statusor absl::strings)

baton_library(baton_thread_pool
  SRCS ${CMAKE_CURRENT_LIST_DIR}/thread_pool.cc
  DEPS absl::status absl::statusor absl::strings Threads::Threads)

# The SIMD paths are selected per function (target attributes) at run time,
# so this library builds for any x86-64. Contraction is off: every multiply
# and add is exactly the one written, which the bit-exact reduction order
# (matmul_kernels.h) relies on.
baton_library(baton_matmul
  SRCS ${CMAKE_CURRENT_LIST_DIR}/quantize_activations.cc
       ${CMAKE_CURRENT_LIST_DIR}/matmul.cc
       ${CMAKE_CURRENT_LIST_DIR}/matmul_scalar.cc
       ${CMAKE_CURRENT_LIST_DIR}/matmul_avx2.cc
       ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512.cc
       ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512bw.cc
  DEPS baton_cpu_features baton_thread_pool baton_tensor baton_common
       absl::status absl::statusor absl::strings)
target_compile_options(baton_matmul PRIVATE -ffp-contract=off)
# ThreadSanitizer does not look inside the matrix-multiply tiles: they hold
# no synchronisation, read weights (immutable once loaded) and activations
# quantized before the pool starts, and write their own rows of the output.
# Instrumented, their vector loads were most of the TSan stage's time (a
# chunked-prefill handoff test: 90 s instrumented, 16 s without). The pool
# hand-off that orders those accesses stays instrumented and is checked by
# thread_pool_test under TSan; ASan still checks every tile access.
if(BATON_SANITIZE MATCHES "thread")
  set_source_files_properties(
    ${CMAKE_CURRENT_LIST_DIR}/matmul_scalar.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx2.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512bw.cc
    TARGET_DIRECTORY baton_matmul
    PROPERTIES COMPILE_OPTIONS -fno-sanitize=thread)
endif()

baton_test(thread_pool_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/thread_pool_test.cc
  DEPS baton_thread_pool
  PROPERTIES LABELS sanitize)
baton_test(quantize_activations_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/quantize_activations_test.cc
  DEPS baton_matmul)
baton_test(matmul_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/matmul_test.cc
  DEPS baton_matmul)

if(NOT BATON_FUZZ)
  add_executable(matmul_bench
    ${CMAKE_CURRENT_LIST_DIR}/../../bench/kernels/matmul_bench.cc)
  target_compile_options(matmul_bench PRIVATE ${BATON_WARNINGS})
  target_link_libraries(matmul_bench PRIVATE baton_matmul baton_bench_util)
endif()
