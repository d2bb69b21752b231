#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace baton {
namespace {

using matmul_internal::FloatArgs;
using matmul_internal::KernelTable;
using matmul_internal::QuantArgs;

// Rows per unit of parallel work: a multiple of every path's tile height.
constexpr int64_t kRowsPerUnit = 16;
// Tokens per pass over a thread's rows, so a pass's activations stay in L2.
constexpr int64_t kTokensPerPass = 128;
// Below this many multiply-adds a wake-up costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

const KernelTable& Kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Vnni:
      return matmul_internal::Avx512VnniKernels();
    case CpuIsa::kAvx512:
      return matmul_internal::Avx512Kernels();
    case CpuIsa::kAvx2:
      return matmul_internal::Avx2Kernels();
    case CpuIsa::kScalar:
      break;
  }
  return matmul_internal::ScalarKernels();
}

bool IsQuantized(DType dtype) {
  return dtype == DType::kQ4_0 || dtype == DType::kQ4_1 ||
         dtype == DType::kQ8_0 || dtype == DType::kQ4_KR ||
         dtype == DType::kQ6_KR || dtype == DType::kQ5_KR;
}

absl::Status Validate(const TensorView& weight, int64_t tokens, int64_t k,
                      const float* x, const float* y,
                      const MatMulOptions& options) {
  switch (weight.dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
    case DType::kQ4_KR:
    case DType::kQ6_KR:
    case DType::kQ5_KR:
      break;
    default:
      return absl::UnimplementedError(absl::StrCat(
          "MatMul does not support weight dtype ",
          FindDTypeInfo(static_cast<uint32_t>(weight.dtype)) != nullptr
              ? DTypeName(weight.dtype)
              : absl::string_view("(unknown)"),
          " of weight \"", weight.name,
          "\" (supported: F32, F16, Q4_0, Q4_1, Q8_0, Q4_K_R, Q5_K_R, "
          "Q6_K_R)"));
  }
  if (weight.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MatMul weight \"", weight.name, "\" must be 2-D [rows, k], got shape ",
        ShapeToString(weight.shape)));
  }
  const int64_t wk = weight.shape[1];
  if (wk <= 0 || wk % 32 != 0 || weight.shape[0] < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul weight \"", weight.name, "\" shape ",
                     ShapeToString(weight.shape),
                     ": k must be a positive multiple of 32 and rows >= 0"));
  }
  if (k != wk) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul input has k = ", k, " but weight \"", weight.name,
                     "\" has k = ", wk));
  }
  BATON_ASSIGN_OR_RETURN(const uint64_t bytes,
                         TensorBytes(weight.dtype, weight.shape));
  if (bytes > 0 && (weight.data == nullptr || weight.nbytes < bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul weight \"", weight.name, "\" of shape ",
                     ShapeToString(weight.shape), " needs ", bytes,
                     " bytes of ", DTypeName(weight.dtype), " data, has ",
                     weight.data == nullptr ? 0 : weight.nbytes));
  }
  if (tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul tokens must be >= 0, got ", tokens));
  }
  if (tokens > 0 && weight.shape[0] > 0 && (x == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError("MatMul x and y must be non-null");
  }
  if (!IsCpuIsaSupported(options.isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CPU ISA ", CpuIsaName(options.isa), " is not supported by this CPU"));
  }
  return absl::OkStatus();
}

}  // namespace

void MatMulInput::Reset(const float* x, int64_t tokens, int64_t k) {
  x_ = x;
  tokens_ = tokens;
  k_ = k;
  quantized_ = false;
}

absl::StatusOr<const Q8Activations*> MatMulInput::Quantized(ThreadPool* pool,
                                                            CpuIsa isa) {
  if (!quantized_) {
    BATON_RETURN_IF_ERROR(
        QuantizeActivations(x_, tokens_, k_, &q8_, pool, isa));
    quantized_ = true;
  }
  return &q8_;
}

absl::Status MatMul(const TensorView& weight, MatMulInput& input, float* y,
                    ThreadPool* pool, const MatMulOptions& options) {
  const MatMulTarget target{&weight, y};
  return MatMulGroup({&target, 1}, input, pool, options);
}

absl::Status MatMulGroup(std::span<const MatMulTarget> targets,
                         MatMulInput& input, ThreadPool* pool,
                         const MatMulOptions& options) {
  const int64_t tokens = input.tokens();
  // One job per weight; units of kRowsPerUnit rows numbered across all jobs
  // so that a single parallel region covers every weight.
  struct Job {
    const TensorView* weight;
    float* y;
    int64_t rows, k, row_bytes;
    const Q8Activations* q8;
    void (*quant_fn)(const QuantArgs&);
    void (*float_fn)(const FloatArgs&);
    int64_t first_unit;
  };
  std::vector<Job> jobs;
  jobs.reserve(targets.size());
  const KernelTable& kernels = Kernels(options.isa);
  int64_t units = 0, macs = 0;
  for (const MatMulTarget& t : targets) {
    const TensorView& weight = *t.weight;
    BATON_RETURN_IF_ERROR(
        Validate(weight, tokens, input.k(), input.x(), t.y, options));
    const int64_t rows = weight.shape[0];
    const int64_t k = weight.shape[1];
    if (rows == 0 || tokens == 0) continue;
    Job job{&weight,
            t.y,
            rows,
            k,
            k / GetDTypeInfo(weight.dtype).block_size *
                GetDTypeInfo(weight.dtype).block_bytes,
            nullptr,
            nullptr,
            nullptr,
            units};
    if (IsQuantized(weight.dtype)) {
      BATON_ASSIGN_OR_RETURN(job.q8, input.Quantized(pool, options.isa));
      job.quant_fn = weight.dtype == DType::kQ4_0    ? kernels.q4_0
                     : weight.dtype == DType::kQ4_1  ? kernels.q4_1
                     : weight.dtype == DType::kQ4_KR ? kernels.q4_kr
                     : weight.dtype == DType::kQ6_KR ? kernels.q6_kr
                     : weight.dtype == DType::kQ5_KR ? kernels.q5_kr
                                                     : kernels.q8_0;
    } else {
      job.float_fn = weight.dtype == DType::kF16 ? kernels.f16 : kernels.f32;
    }
    units += (rows + kRowsPerUnit - 1) / kRowsPerUnit;
    macs += rows * k * tokens;
    jobs.push_back(job);
  }
  if (units == 0) return absl::OkStatus();

  auto run = [&](int64_t unit_begin, int64_t unit_end) {
    for (const Job& job : jobs) {
      const int64_t job_units = (job.rows + kRowsPerUnit - 1) / kRowsPerUnit;
      const int64_t ub = std::max(unit_begin, job.first_unit) - job.first_unit;
      const int64_t ue =
          std::min(unit_end, job.first_unit + job_units) - job.first_unit;
      if (ub >= ue) continue;
      const int64_t r0 = ub * kRowsPerUnit;
      const int64_t r1 = std::min(job.rows, ue * kRowsPerUnit);
      const uint8_t* w = job.weight->data + r0 * job.row_bytes;
      for (int64_t t0 = 0; t0 < tokens; t0 += kTokensPerPass) {
        const int64_t t1 = std::min(tokens, t0 + kTokensPerPass);
        if (job.q8 != nullptr) {
          job.quant_fn(QuantArgs{w, job.row_bytes, r1 - r0, job.q8, t0, t1,
                                 job.y + r0, job.rows});
        } else {
          job.float_fn(FloatArgs{w, job.row_bytes, r1 - r0, job.k, input.x(),
                                 t0, t1, job.y + r0, job.rows});
        }
      }
    }
  };
  if (pool != nullptr && units > 1 && macs >= kMinParallelMacs) {
    pool->ParallelFor(units, run);
  } else {
    run(0, units);
  }
  return absl::OkStatus();
}

absl::Status MatMul(const TensorView& weight, const float* x, int64_t tokens,
                    float* y, ThreadPool* pool, const MatMulOptions& options) {
  MatMulInput input(x, tokens, weight.shape.size() == 2 ? weight.shape[1] : 0);
  return MatMul(weight, input, y, pool, options);
}

}  // namespace baton
