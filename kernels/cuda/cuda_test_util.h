// What the CUDA kernel tests share: the device check that skips a test (never
// passes it) on a machine without a GPU, device buffers poisoned before each
// run so a kernel that skips an element is caught, and the tolerance check
// |got - ref| <= atol + |ref| * rtol that reports the worst element.
#ifndef BATON_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define BATON_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton::cuda_test {

// Empty if a CUDA device can run kernels here; otherwise why not.
inline std::string CudaUnavailableReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "cudaGetDeviceCount reports 0 devices";
  return "";
}

// Skips the current test, naming the reason, when no device is present.
#define BATON_SKIP_WITHOUT_CUDA()                                 \
  do {                                                            \
    const std::string baton_why_ =                                \
        ::baton::cuda_test::CudaUnavailableReason();              \
    if (!baton_why_.empty()) {                                    \
      GTEST_SKIP() << "no CUDA device (" << baton_why_            \
                   << "): this kernel is compiled here, not run"; \
    }                                                             \
  } while (false)

// Fails the current test with the CUDA error's name unless cudaSuccess.
#define BATON_ASSERT_CUDA_OK(expr)                              \
  do {                                                          \
    const cudaError_t baton_err_ = (expr);                      \
    ASSERT_EQ(baton_err_, cudaSuccess)                          \
        << #expr << ": " << cudaGetErrorName(baton_err_) << " " \
        << cudaGetErrorString(baton_err_);                      \
  } while (false)

// A cudaMalloc'd array of T (never managed memory). Errors are recorded as
// gtest failures; check HasFatalFailure()/the returned status after use.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    const cudaError_t err =
        cudaMalloc(&ptr_, std::max<size_t>(1, n) * sizeof(T));
    EXPECT_EQ(err, cudaSuccess) << "cudaMalloc of " << n * sizeof(T)
                                << " bytes: " << cudaGetErrorString(err);
    if (err != cudaSuccess) ptr_ = nullptr;
  }
  // From host data.
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) {
    Upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void Upload(std::span<const T> host) {
    ASSERT_EQ(host.size(), n_);
    BATON_ASSERT_CUDA_OK(
        cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  // Every byte 0xFF: NaN for float, half and bfloat16, -1 for integers.
  void Poison() { BATON_ASSERT_CUDA_OK(cudaMemset(ptr_, 0xFF, bytes())); }
  // Synchronizes the device first so a kernel's asynchronous error shows.
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    const cudaError_t sync = cudaDeviceSynchronize();
    EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
    const cudaError_t err =
        cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Largest |got - ref| and where, over elements compared.
struct MaxError {
  double abs = 0;
  size_t index = 0;
};

// Expects |got[i] - ref[i]| <= atol + |ref[i]| * rtol for every i (a NaN in
// got fails); reports the first violation and returns the largest error.
inline MaxError ExpectAllClose(std::span<const float> got,
                               std::span<const float> ref, double atol,
                               double rtol, const std::string& what) {
  MaxError worst;
  EXPECT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double tol = atol + std::fabs(static_cast<double>(ref[i])) * rtol;
    if (!(err <= tol)) {
      if (bad++ == 0) {
        ADD_FAILURE() << what << ": element " << i << " is " << got[i]
                      << ", reference " << ref[i] << " (tolerance " << tol
                      << ")";
      }
    }
    if (err > worst.abs || std::isnan(err)) worst = {err, i};
  }
  if (bad > 1)
    ADD_FAILURE() << what << ": " << bad << " elements out of tolerance";
  return worst;
}

}  // namespace baton::cuda_test

#endif  // BATON_KERNELS_CUDA_CUDA_TEST_UTIL_H_
