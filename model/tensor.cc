#include "model/tensor.h"

#include <array>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace baton {
namespace {

constexpr std::array<DTypeInfo, 23> kDTypes = {{
    {DType::kF32, "F32", 1, 4},
    {DType::kF16, "F16", 1, 2},
    {DType::kQ4_0, "Q4_0", 32, 18},
    {DType::kQ4_1, "Q4_1", 32, 20},
    {DType::kQ5_0, "Q5_0", 32, 22},
    {DType::kQ5_1, "Q5_1", 32, 24},
    {DType::kQ8_0, "Q8_0", 32, 34},
    {DType::kQ8_1, "Q8_1", 32, 36},
    {DType::kQ2_K, "Q2_K", 256, 84},
    {DType::kQ3_K, "Q3_K", 256, 110},
    {DType::kQ4_K, "Q4_K", 256, 144},
    {DType::kQ5_K, "Q5_K", 256, 176},
    {DType::kQ6_K, "Q6_K", 256, 210},
    {DType::kQ8_K, "Q8_K", 256, 292},
    {DType::kI8, "I8", 1, 1},
    {DType::kI16, "I16", 1, 2},
    {DType::kI32, "I32", 1, 4},
    {DType::kI64, "I64", 1, 8},
    {DType::kF64, "F64", 1, 8},
    {DType::kBF16, "BF16", 1, 2},
    {DType::kQ4_KR, "Q4_K_R", 32, 24, /*internal=*/true},
    {DType::kQ6_KR, "Q6_K_R", 32, 40, /*internal=*/true},
    {DType::kQ5_KR, "Q5_K_R", 32, 40, /*internal=*/true},
}};

}  // namespace

const DTypeInfo* FindDTypeInfo(uint32_t ggml_type) {
  for (const DTypeInfo& info : kDTypes) {
    if (static_cast<uint32_t>(info.dtype) == ggml_type) return &info;
  }
  return nullptr;
}

const DTypeInfo& GetDTypeInfo(DType dtype) {
  const DTypeInfo* info = FindDTypeInfo(static_cast<uint32_t>(dtype));
  BATON_CHECK(info != nullptr)
      << "unknown DType " << static_cast<uint32_t>(dtype);
  return *info;
}

absl::StatusOr<uint64_t> TensorBytes(DType dtype,
                                     std::span<const int64_t> shape) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeToString(shape)));
    }
    if (d != 0 && elements > kMax / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "element count of shape ", ShapeToString(shape), " overflows"));
    }
    elements *= static_cast<uint64_t>(d);
  }
  int64_t row = shape.empty() ? 1 : shape.back();
  if (row % info.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("innermost dimension ", row, " of shape ",
                     ShapeToString(shape), " is not a multiple of ", info.name,
                     "'s block size ", info.block_size));
  }
  uint64_t blocks = elements / static_cast<uint64_t>(info.block_size);
  if (blocks > kMax / static_cast<uint64_t>(info.block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte size of shape ", ShapeToString(shape), " overflows"));
  }
  return blocks * static_cast<uint64_t>(info.block_bytes);
}

std::string ShapeToString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace baton
