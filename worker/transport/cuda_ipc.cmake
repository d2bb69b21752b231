# --- CUDA IPC KV transport (two processes on one GPU) ------------------------
# The protocol library is CUDA-free: every CUDA runtime call goes through
# CudaIpcApi, so the whole protocol is tested over FakeCudaIpcApi; the
# runtime implementation and the GPU checks need the toolkit and skip
# without a device. This file may be included with BATON_CUDA OFF too (then
# only the CUDA-free part is defined).
baton_library(baton_cuda_ipc_transport
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_api.cc
       ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_kv_sender.cc
       ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_kv_receiver.cc
  DEPS baton_kv_transport baton_kv_cache baton_common absl::status
       absl::statusor absl::strings absl::synchronization absl::time
       Threads::Threads)

baton_library(baton_cuda_ipc_fake_api
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_fake_api.cc
  DEPS baton_cuda_ipc_transport)

baton_test(cuda_ipc_api_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_api_test.cc
  DEPS baton_cuda_ipc_fake_api PROPERTIES LABELS sanitize)
baton_test(cuda_ipc_kv_transport_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_kv_transport_test.cc
  DEPS baton_cuda_ipc_fake_api baton_kv_cache PROPERTIES LABELS sanitize)

if(NOT BATON_CUDA)
  return()
endif()

baton_library(baton_cuda_ipc_cuda_api
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_api_cuda.cc
  DEPS baton_cuda_ipc_transport baton_cuda_elementwise CUDA::cudart)

# The receiving process of the cross-process GPU check (and a manual probe):
# see cuda_ipc_kv_probe.cc.
add_executable(cuda_ipc_kv_probe ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_kv_probe.cc
               ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_llama_fixture.cc)
target_compile_options(cuda_ipc_kv_probe PRIVATE ${BATON_WARNINGS})
target_link_libraries(cuda_ipc_kv_probe PRIVATE baton_cuda_ipc_cuda_api
                      baton_kv_cache CUDA::cudart)

baton_test(cuda_ipc_kv_gpu_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_kv_gpu_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_llama_fixture.cc
  DEPS baton_cuda_ipc_cuda_api baton_kv_cache baton_cuda_test_util)
target_compile_definitions(cuda_ipc_kv_gpu_test PRIVATE
  BATON_CUDA_IPC_PROBE="$<TARGET_FILE:cuda_ipc_kv_probe>")
add_dependencies(cuda_ipc_kv_gpu_test cuda_ipc_kv_probe)

# One-rank NCCL send/recv to itself on one device.
baton_test(nccl_self_send_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/nccl_self_send_test.cc
  DEPS baton::nccl CUDA::cudart baton_cuda_test_util)
