#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton::cuda {
namespace {

absl::Status CublasError(absl::string_view call, cublasStatus_t status) {
  const std::string message =
      absl::StrCat(call, ": ", cublasGetStatusName(status), " (",
                   cublasGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_LICENSE_ERROR:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaRuntimeError(absl::string_view call, cudaError_t err) {
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(err),
                                           " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

cudaDataType_t CudaType(GemmType type) {
  switch (type) {
    case GemmType::kF16:
      return CUDA_R_16F;
    case GemmType::kBF16:
      return CUDA_R_16BF;
    case GemmType::kF32:
      break;
  }
  return CUDA_R_32F;
}

const char* TypeName(GemmType type) {
  switch (type) {
    case GemmType::kF16:
      return "f16";
    case GemmType::kBF16:
      return "bf16";
    case GemmType::kF32:
      break;
  }
  return "f32";
}

bool IsKnownType(GemmType type) {
  return type == GemmType::kF32 || type == GemmType::kF16 ||
         type == GemmType::kBF16;
}

// The (A/B type, C type) pairs cublasGemmEx accepts with CUBLAS_COMPUTE_32F
// that Baton uses.
bool IsSupportedPair(GemmType in, GemmType out) {
  return out == GemmType::kF32 || in == out;
}

}  // namespace

struct CudaGemm::Handle {
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;

  ~Handle() {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (workspace != nullptr) cudaFree(workspace);
  }
};

CudaGemm::CudaGemm(cudaStream_t stream, std::unique_ptr<Handle> handle)
    : stream_(stream), handle_(std::move(handle)) {}

CudaGemm::~CudaGemm() = default;

absl::StatusOr<std::unique_ptr<CudaGemm>> CudaGemm::Create(
    cudaStream_t stream, const CudaGemmOptions& options) {
  int device_count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&device_count);
  if (count_err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(count_err), " (",
                     cudaGetErrorString(count_err), ")"));
  }
  if (device_count == 0) {
    return absl::FailedPreconditionError("no CUDA device is present");
  }
  auto handle = std::make_unique<Handle>();
  if (options.workspace_bytes > 0) {
    const cudaError_t err =
        cudaMalloc(&handle->workspace, options.workspace_bytes);
    if (err != cudaSuccess) {
      handle->workspace = nullptr;
      return CudaRuntimeError(
          absl::StrCat("cudaMalloc(", options.workspace_bytes,
                       " bytes of cuBLAS workspace)"),
          err);
    }
  }
  cublasStatus_t status = cublasCreate(&handle->cublas);
  if (status != CUBLAS_STATUS_SUCCESS) {
    handle->cublas = nullptr;
    return CublasError("cublasCreate", status);
  }
  // cublasSetStream resets the workspace to cuBLAS's own pool, so the
  // workspace is set after it.
  status = cublasSetStream(handle->cublas, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError("cublasSetStream", status);
  }
  status = cublasSetWorkspace(handle->cublas, handle->workspace,
                              options.workspace_bytes);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError("cublasSetWorkspace", status);
  }
  // No TF32 for float inputs; split-K partial sums stay in float32 even when
  // the output is bf16/fp16.
  status = cublasSetMathMode(
      handle->cublas, static_cast<cublasMath_t>(
                          CUBLAS_DEFAULT_MATH |
                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError("cublasSetMathMode", status);
  }
  status = cublasSetPointerMode(handle->cublas, CUBLAS_POINTER_MODE_HOST);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError("cublasSetPointerMode", status);
  }
  return std::unique_ptr<CudaGemm>(new CudaGemm(stream, std::move(handle)));
}

absl::Status CudaGemm::ValidateMatmul(GemmType in_type, const void* x,
                                      const void* w, GemmType out_type,
                                      const void* y, int64_t m, int64_t n,
                                      int64_t k) {
  if (!IsKnownType(in_type) || !IsKnownType(out_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown GemmType (in ", static_cast<int>(in_type),
                     ", out ", static_cast<int>(out_type), ")"));
  }
  if (!IsSupportedPair(in_type, out_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GEMM types: input ", TypeName(in_type),
                     ", output ", TypeName(out_type),
                     "; supported: bf16->f32, bf16->bf16, f16->f32, "
                     "f16->f16, f32->f32"));
  }
  if (m < 0 || n < 0 || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM sizes must be >= 0, got m=", m, " n=", n, " k=", k));
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GEMM sizes must be <= ", INT_MAX, ", got m=", m, " n=", n, " k=", k));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM k must be >= 1 when m and n are positive, got m=", m,
                     " n=", n, " k=0"));
  }
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM pointers must not be null (x ", x != nullptr, ", w ",
                     w != nullptr, ", y ", y != nullptr, ")"));
  }
  return absl::OkStatus();
}

// Row-major to column-major: a row-major [r][c] matrix is, to cuBLAS, the
// column-major c x r matrix (its transpose) with leading dimension c. So
//   x (row-major [m][k])  is  X^T, column-major k x m, ld k;
//   w (row-major [n][k])  is  W^T, column-major k x n, ld k;
//   y (row-major [m][n])  is  Y^T, column-major n x m, ld n.
// y = x * W^T  <=>  Y^T = W * x^T = op_T(W^T) * op_N(X^T): cuBLAS computes
// C (n x m) = op(A) (n x k) * op(B) (k x m) with A = w, transa = T, lda = k,
// B = x, transb = N, ldb = k, C = y, ldc = n.
absl::Status CudaGemm::Matmul(GemmType in_type, const void* x, const void* w,
                              GemmType out_type, void* y, int64_t m, int64_t n,
                              int64_t k, bool accumulate) {
  if (absl::Status s = ValidateMatmul(in_type, x, w, out_type, y, m, n, k);
      !s.ok()) {
    return s;
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  const int im = static_cast<int>(m);
  const int in = static_cast<int>(n);
  const int ik = static_cast<int>(k);
  const cublasStatus_t status = cublasGemmEx(
      handle_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, in, im, ik, &alpha, w,
      CudaType(in_type), ik, x, CudaType(in_type), ik, &beta, y,
      CudaType(out_type), in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError(
        absl::StrCat("cublasGemmEx(", TypeName(in_type), "->",
                     TypeName(out_type), ", m=", m, " n=", n, " k=", k, ")"),
        status);
  }
  return absl::OkStatus();
}

}  // namespace baton::cuda
