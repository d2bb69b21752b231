#include "worker/cuda/cuda_bench_ceilings.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/float16.h"
#include "kernels/cuda/gemm.h"
#include "worker/cuda/device_memory.h"

namespace baton {
namespace {

// A stream and two timing events, destroyed with the object.
class Timer {
 public:
  Timer() = default;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Init() {
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags"));
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreate(&start_), "cudaEventCreate"));
    return CudaStatus(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  cudaStream_t stream() const { return stream_; }
  absl::Status Start() {
    return CudaStatus(cudaEventRecord(start_, stream_), "cudaEventRecord");
  }
  // Milliseconds since Start, after waiting for the stream.
  absl::StatusOr<float> StopMs() {
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(stop_, stream_), "cudaEventRecord"));
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaEventSynchronize(stop_), "cudaEventSynchronize"));
    float ms = 0;
    BATON_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start_, stop_),
                                     "cudaEventElapsedTime"));
    return ms;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// n bf16 values uniform in [-1, 1) from a xorshift generator.
std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint16_t& x : out) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float u = static_cast<float>(s >> 40) / static_cast<float>(1 << 24);
    x = F32ToBF16(2.0f * u - 1.0f);
  }
  return out;
}

}  // namespace

absl::StatusOr<double> MeasureHbmBandwidth(uint64_t bytes, int repeats) {
  Timer timer;
  BATON_RETURN_IF_ERROR(timer.Init());
  BATON_ASSIGN_OR_RETURN(DeviceAllocation src,
                         DeviceAllocation::Create(bytes, "HBM test source"));
  BATON_ASSIGN_OR_RETURN(DeviceAllocation dst,
                         DeviceAllocation::Create(bytes, "HBM test target"));
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(src.get(), 1, bytes, timer.stream()), "cudaMemsetAsync"));
  float best = 0;
  for (int r = -1; r < repeats; ++r) {
    BATON_RETURN_IF_ERROR(timer.Start());
    BATON_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dst.get(), src.get(), bytes,
                                   cudaMemcpyDeviceToDevice, timer.stream()),
                   "cudaMemcpyAsync (device to device)"));
    BATON_ASSIGN_OR_RETURN(const float ms, timer.StopMs());
    if (r >= 0 && (best == 0 || ms < best)) best = ms;
  }
  if (best <= 0) return absl::InternalError("HBM copy took no time");
  return 2.0 * static_cast<double>(bytes) / (best * 1e-3) / 1e9;
}

absl::StatusOr<double> MeasureBf16GemmTflops(int64_t m, int64_t n, int64_t k,
                                             int repeats) {
  Timer timer;
  BATON_RETURN_IF_ERROR(timer.Init());
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaGemm> gemm,
                         cuda::CudaGemm::Create(timer.stream()));
  BATON_ASSIGN_OR_RETURN(
      DeviceAllocation x,
      DeviceAllocation::Create(static_cast<uint64_t>(m * k) * 2, "GEMM x"));
  BATON_ASSIGN_OR_RETURN(
      DeviceAllocation w,
      DeviceAllocation::Create(static_cast<uint64_t>(n * k) * 2, "GEMM w"));
  BATON_ASSIGN_OR_RETURN(
      DeviceAllocation y,
      DeviceAllocation::Create(static_cast<uint64_t>(m * n) * 4, "GEMM y"));
  const std::vector<uint16_t> hx = RandomBf16(m * k, 1);
  const std::vector<uint16_t> hw = RandomBf16(n * k, 2);
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(x.get(), hx.data(), x.bytes(), cudaMemcpyHostToDevice),
      "cudaMemcpy GEMM x"));
  BATON_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(w.get(), hw.data(), w.bytes(), cudaMemcpyHostToDevice),
      "cudaMemcpy GEMM w"));
  float best = 0;
  for (int r = -1; r < repeats; ++r) {
    BATON_RETURN_IF_ERROR(timer.Start());
    BATON_RETURN_IF_ERROR(gemm->MatmulBf16(x.as<uint16_t>(), w.as<uint16_t>(),
                                           y.as<float>(), m, n, k));
    BATON_ASSIGN_OR_RETURN(const float ms, timer.StopMs());
    if (r >= 0 && (best == 0 || ms < best)) best = ms;
  }
  if (best <= 0) return absl::InternalError("GEMM took no time");
  return 2.0 * static_cast<double>(m) * n * k / (best * 1e-3) / 1e12;
}

}  // namespace baton
