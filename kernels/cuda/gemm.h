// Dense matrix products on the GPU through cuBLAS, in the engine's weight
// layout: y[M][N] = x[M][K] * W[N][K]^T, every matrix row-major and
// contiguous (W's rows are output features, as in GGUF/safetensors).
//
// Supported (input, output) types; every product accumulates in float32
// (CUBLAS_COMPUTE_32F, no TF32, no reduced-precision split-K reduction):
//   (kBF16, kF32)  (kBF16, kBF16)  (kF16, kF32)  (kF16, kF16)  (kF32, kF32)
// bf16/fp16 tensors are stored as uint16_t bit patterns. x and W share one
// type: float32 activations must be converted to bf16/fp16 first.
//
// Errors are absl::Status, not cudaError_t, so that a failure names the
// cuBLAS call and its cublasStatus_t (cuBLAS reports problems that have no
// cudaError_t, e.g. CUBLAS_STATUS_NOT_SUPPORTED): bad arguments are
// InvalidArgument without touching the device; cuBLAS failures map to
// InvalidArgument (INVALID_VALUE), ResourceExhausted (ALLOC_FAILED),
// Unimplemented (NOT_SUPPORTED, ARCH_MISMATCH), FailedPrecondition
// (NOT_INITIALIZED, LICENSE_ERROR) or Internal (anything else).
//
// Asynchrony: Matmul only enqueues work on the stream the object is bound to
// and never synchronizes; pointers must stay valid until the stream reaches
// the product. A CudaGemm must not be used from two threads at once.
//
// CUDA graphs: Matmul may be captured (stream capture on the bound stream).
// The handle's workspace is fixed at Create (cublasSetWorkspace, never reset:
// the stream is set once, before it), so a captured product allocates
// nothing; with workspace_bytes == 0 cuBLAS runs without one. Run each
// shape once outside the capture first so that cuBLAS's own lazy set-up
// (kernel choice, module loading) does not happen inside it.
//
// Determinism: cuBLAS gives bit-identical results for identical shapes on
// the same GPU model and library version, because the workspace is fixed
// (cublasSetWorkspace) per handle. Different M may select different
// kernels, so a row's result may differ in the last bits with the batch
// size.
#ifndef BATON_KERNELS_CUDA_GEMM_H_
#define BATON_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::cuda {

// Element type of a GEMM operand.
enum class GemmType : int {
  kF32,   // float
  kF16,   // IEEE half, uint16_t storage
  kBF16,  // bfloat16, uint16_t storage
};

struct CudaGemmOptions {
  // --- Performance ---------------------------------------------------------
  // Device workspace handed to cuBLAS (cublasSetWorkspace). 32 MiB is what
  // cuBLAS recommends for Hopper; 0 makes cuBLAS use no workspace.
  size_t workspace_bytes = size_t{32} << 20;
};

class CudaGemm {
 public:
  // Creates a cuBLAS handle bound to `stream` (nullptr: the legacy default
  // stream) on the current device, with its own workspace. Synchronizes the
  // device (cudaMalloc). FailedPrecondition if no device is usable,
  // ResourceExhausted if the workspace cannot be allocated.
  static absl::StatusOr<std::unique_ptr<CudaGemm>> Create(
      cudaStream_t stream, const CudaGemmOptions& options = {});

  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;
  // Destroys the handle and frees the workspace (cudaFree waits for the
  // device, so products still in flight finish first).
  ~CudaGemm();

  // y[m][n] = x[m][k] * w[n][k]^T, plus the previous y if `accumulate`
  // (beta = 1; otherwise y is only written, never read, so it may hold
  // garbage). x: [m][k] of in_type, w: [n][k] of in_type, y: [m][n] of
  // out_type, all device pointers, row-major and contiguous. Any k >= 1 works
  // (odd k included); m == 0 or n == 0 is a no-op. InvalidArgument if a size
  // is negative, k < 1 with m, n > 0, a size or leading dimension exceeds
  // INT32_MAX, a needed pointer is null, or (in_type, out_type) is not one of
  // the supported pairs.
  absl::Status Matmul(GemmType in_type, const void* x, const void* w,
                      GemmType out_type, void* y, int64_t m, int64_t n,
                      int64_t k, bool accumulate = false);

  // Typed forms of Matmul.
  absl::Status MatmulBf16(const uint16_t* x, const uint16_t* w, float* y,
                          int64_t m, int64_t n, int64_t k,
                          bool accumulate = false) {
    return Matmul(GemmType::kBF16, x, w, GemmType::kF32, y, m, n, k,
                  accumulate);
  }
  absl::Status MatmulBf16ToBf16(const uint16_t* x, const uint16_t* w,
                                uint16_t* y, int64_t m, int64_t n, int64_t k) {
    return Matmul(GemmType::kBF16, x, w, GemmType::kBF16, y, m, n, k);
  }
  absl::Status MatmulF16(const uint16_t* x, const uint16_t* w, float* y,
                         int64_t m, int64_t n, int64_t k,
                         bool accumulate = false) {
    return Matmul(GemmType::kF16, x, w, GemmType::kF32, y, m, n, k, accumulate);
  }
  absl::Status MatmulF32(const float* x, const float* w, float* y, int64_t m,
                         int64_t n, int64_t k, bool accumulate = false) {
    return Matmul(GemmType::kF32, x, w, GemmType::kF32, y, m, n, k, accumulate);
  }

  // The checks Matmul makes before touching the device (usable without one).
  static absl::Status ValidateMatmul(GemmType in_type, const void* x,
                                     const void* w, GemmType out_type,
                                     const void* y, int64_t m, int64_t n,
                                     int64_t k);

  cudaStream_t stream() const { return stream_; }

 private:
  struct Handle;
  CudaGemm(cudaStream_t stream, std::unique_ptr<Handle> handle);

  cudaStream_t stream_;
  std::unique_ptr<Handle> handle_;
};

}  // namespace baton::cuda

#endif  // BATON_KERNELS_CUDA_GEMM_H_
