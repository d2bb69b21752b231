#include "worker/cuda/device_memory.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {

absl::Status CudaStatus(cudaError_t err, absl::string_view op) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

absl::StatusOr<DeviceAllocation> DeviceAllocation::Create(
    uint64_t bytes, absl::string_view what) {
  if (bytes == 0) return DeviceAllocation();
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaSuccess) return DeviceAllocation(ptr, bytes);
  // cudaMalloc's errors are not sticky, but cudaGetLastError would still
  // report them to the next kernel launch check.
  cudaGetLastError();
  const std::string message =
      absl::StrCat("cudaMalloc of ", bytes, " bytes for ", what, ": ",
                   cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceAllocation& DeviceAllocation::operator=(
    DeviceAllocation&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceAllocation::~DeviceAllocation() { Reset(); }

void DeviceAllocation::Reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status EnsureDeviceBytes(DeviceAllocation* allocation, uint64_t bytes,
                               absl::string_view what,
                               std::vector<DeviceAllocation>* retired) {
  if (allocation->bytes() >= bytes) return absl::OkStatus();
  const uint64_t want = std::max(bytes, 2 * allocation->bytes());
  if (retired != nullptr && allocation->get() != nullptr) {
    retired->push_back(std::move(*allocation));
  }
  *allocation = DeviceAllocation();
  absl::StatusOr<DeviceAllocation> grown = DeviceAllocation::Create(want, what);
  if (!grown.ok()) return grown.status();
  *allocation = std::move(*grown);
  return absl::OkStatus();
}

}  // namespace baton
