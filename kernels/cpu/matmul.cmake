# CPU matrix-multiply kernels, their thread pool and benchmark.
# Included from kernels/cpu/CMakeLists.txt.

baton_library(baton_cpu_features
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cpu_features.cc
  DEPS absl::status absl::statusor absl::strings)

baton_library(baton_thread_pool
  SRCS ${CMAKE_CURRENT_LIST_DIR}/thread_pool.cc
  DEPS absl::status absl::statusor absl::strings Threads::Threads)

# Sanitizer trees do not instrument the matrix-multiply tiles inside the
# engine: they hold no synchronisation, read weights (immutable once loaded)
# and activations quantized before the pool starts, and write their own rows
# of the output. Instrumented, their vector loads were most of the sanitizer
# stages' time (TSan: a chunked-prefill handoff test 90 s instrumented, 16 s
# without; ASan+UBSan: 65% of the busy CPU of the cluster equivalence test).
# The pool hand-off that orders those accesses stays instrumented (checked
# by thread_pool_test under TSan), and under ASan+UBSan matmul_test and
# quantize_activations_test link baton_matmul_checked, the same sources with
# every tile instrumented (BATON_CHECK_TILES), so each tile path is still
# checked on odd shapes and at every edge.
set(_baton_matmul_srcs
  ${CMAKE_CURRENT_LIST_DIR}/quantize_activations.cc
  ${CMAKE_CURRENT_LIST_DIR}/matmul.cc
  ${CMAKE_CURRENT_LIST_DIR}/matmul_scalar.cc
  ${CMAKE_CURRENT_LIST_DIR}/matmul_avx2.cc
  ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512.cc
  ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512bw.cc)
set(_baton_matmul_deps baton_cpu_features baton_thread_pool baton_tensor
    baton_common absl::status absl::statusor absl::strings)
# The SIMD paths are selected per function (target attributes) at run time,
# so this library builds for any x86-64. Contraction is off: every multiply
# and add is exactly the one written, which the bit-exact reduction order
# (matmul_kernels.h) relies on.
baton_library(baton_matmul
  SRCS ${_baton_matmul_srcs} DEPS ${_baton_matmul_deps})
target_compile_options(baton_matmul PRIVATE -ffp-contract=off)
set(_baton_matmul_test_lib baton_matmul)
set(_baton_matmul_test_props)
if(BATON_SANITIZE)
  set_source_files_properties(
    ${CMAKE_CURRENT_LIST_DIR}/matmul_scalar.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx2.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512.cc
    ${CMAKE_CURRENT_LIST_DIR}/matmul_avx512bw.cc
    TARGET_DIRECTORY baton_matmul
    PROPERTIES COMPILE_OPTIONS
      "$<$<NOT:$<BOOL:$<TARGET_PROPERTY:BATON_CHECK_TILES>>>:-fno-sanitize=all>")
  if(BATON_SANITIZE MATCHES "address")
    baton_library(baton_matmul_checked
      SRCS ${_baton_matmul_srcs} DEPS ${_baton_matmul_deps})
    set_target_properties(baton_matmul_checked PROPERTIES BATON_CHECK_TILES ON)
    target_compile_options(baton_matmul_checked PRIVATE -ffp-contract=off)
    set(_baton_matmul_test_lib baton_matmul_checked)
    set(_baton_matmul_test_props PROPERTIES LABELS sanitize)
  endif()
endif()

baton_test(thread_pool_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/thread_pool_test.cc
  DEPS baton_thread_pool
  PROPERTIES LABELS sanitize)
baton_test(quantize_activations_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/quantize_activations_test.cc
  DEPS ${_baton_matmul_test_lib} ${_baton_matmul_test_props})
baton_test(matmul_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/matmul_test.cc
  DEPS ${_baton_matmul_test_lib} ${_baton_matmul_test_props})
if(BATON_SANITIZE MATCHES "address")
  # matmul_test's float64 reference loops, at the sanitizer trees' -O0 for
  # test code, took 95 of the 99 s the test ran under ASan; -O2 inlines
  # their accessors, and the test's own code is not instrumented (78 s of
  # the test's 80 s under clang's ASan+UBSan were those loops): what is
  # checked is the tiles of baton_matmul_checked, and ASan's allocator
  # guards the buffers the test hands them wherever they were allocated.
  # (A source option: it comes after the target's -O0; the tests'
  # precompiled header, built at -O0, does not apply at -O2.)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/matmul_test.cc
    TARGET_DIRECTORY matmul_test
    PROPERTIES COMPILE_OPTIONS "-O2;-fno-sanitize=all"
    SKIP_PRECOMPILE_HEADERS ON)
endif()

if(NOT BATON_FUZZ)
  add_executable(matmul_bench
    ${CMAKE_CURRENT_LIST_DIR}/../../bench/kernels/matmul_bench.cc)
  target_compile_options(matmul_bench PRIVATE ${BATON_WARNINGS})
  target_link_libraries(matmul_bench PRIVATE baton_matmul baton_bench_util)
endif()
