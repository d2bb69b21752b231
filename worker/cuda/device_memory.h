// Owned device memory for the CUDA runner (cudaMalloc, never managed memory)
// and the statuses CUDA runtime errors become.
#ifndef BATON_WORKER_CUDA_DEVICE_MEMORY_H_
#define BATON_WORKER_CUDA_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// OK for cudaSuccess; otherwise Internal "<op>: <cudaErrorName> (<text>)".
absl::Status CudaStatus(cudaError_t err, absl::string_view op);

// One cudaMalloc allocation, freed on destruction. Movable, not copyable.
class DeviceAllocation {
 public:
  // `bytes` >= 0 on the current device (0 allocates nothing and get() is
  // null). ResourceExhausted naming `what` and the bytes when the device is
  // out of memory; FailedPrecondition naming the CUDA error when there is no
  // usable device; Internal for any other CUDA error. The runtime's last
  // error is cleared on failure so that later launch checks do not see it.
  static absl::StatusOr<DeviceAllocation> Create(uint64_t bytes,
                                                 absl::string_view what);

  DeviceAllocation() = default;
  DeviceAllocation(DeviceAllocation&& other) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  DeviceAllocation(void* ptr, uint64_t bytes) : ptr_(ptr), bytes_(bytes) {}
  void Reset();

  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Makes `*allocation` hold at least `bytes` (reallocating, without keeping
// the contents, to max(bytes, 2 * old size) if it is smaller). cudaFree and
// cudaMalloc synchronize the device, so use it outside of hot loops. With
// `retired`, the old allocation is kept there instead of freed: no cudaFree,
// which would wait for every stream of the device (an NCCL receive posted
// for a peer included); the doubling bounds what is kept to less than the
// new size. Errors as DeviceAllocation::Create.
absl::Status EnsureDeviceBytes(
    DeviceAllocation* allocation, uint64_t bytes, absl::string_view what,
    std::vector<DeviceAllocation>* retired = nullptr);

}  // namespace baton

#endif  // BATON_WORKER_CUDA_DEVICE_MEMORY_H_
